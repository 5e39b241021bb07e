"""1,000 mixed requests: the proxy (a real subprocess, recording) returns exactly the bytes the upstream
sends — status, headers, bodies — including streams whose usage the proxy injected and stripped."""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from replayproxy.clock import now_ns
from tests.proxy.helpers import aiohttp_upstream
from tests.servers import start_proxy
from tests.trace.helpers import shapes_of

REQUESTS = 1000


def words(seed: bytes, n: int) -> list[str]:
    digest = hashlib.sha256(seed).hexdigest()
    return [f" w{digest[i % 60 : i % 60 + 4]}é" for i in range(n)]


async def deterministic(request: web.Request) -> web.StreamResponse:
    """Every answer is a pure function of the request, so direct and proxied answers must be equal."""
    body = await request.read()
    path = request.path.removeprefix("/prefix")  # an engine mounted under a path prefix
    if path.startswith("/status/"):
        return web.Response(
            status=int(path.rsplit("/", 1)[1]), body=b'{"error":"' + body[:20].hex().encode() + b'"}'
        )
    if path == "/big":
        size = int(request.query["size"])
        return web.Response(body=bytes(i % 256 for i in range(size)), headers={"X-Size": str(size)})
    if request.method != "POST" or not path.startswith("/v1/"):
        return web.Response(body=request.method.encode() + path.encode() + body, headers={"X-Echo": "1"})
    req = orjson.loads(body)
    prompt = orjson.dumps([req.get("messages"), req.get("prompt"), req.get("input")])  # what an engine reads
    pieces = words(prompt, int(req.get("max_tokens", 5)))
    prompt_tokens = len(prompt) // 10
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": len(pieces),
        "total_tokens": prompt_tokens + len(pieces),
    }
    if path.endswith("/embeddings"):
        return web.json_response({"data": [{"embedding": [len(prompt) / 7, 0.5]}], "usage": usage})
    chat = path.endswith("/chat/completions")
    if not req.get("stream"):
        choice = (
            {"message": {"role": "assistant", "content": "".join(pieces)}}
            if chat
            else {"text": "".join(pieces)}
        )
        return web.json_response(
            {"id": "x", "choices": [{"index": 0, **choice, "finish_reason": "length"}], "usage": usage}
        )
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Stream": "yes"})
    await resp.prepare(request)
    events = [
        b"data: "
        + orjson.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        + b"\n\n"
    ]
    for piece in pieces:
        choice = {"delta": {"content": piece}} if chat else {"text": piece}
        events.append(b"data: " + orjson.dumps({"id": "x", "choices": [{"index": 0, **choice}]}) + b"\n\n")
    if (req.get("stream_options") or {}).get("include_usage"):
        events.append(b"data: " + orjson.dumps({"id": "x", "choices": [], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    for i, event in enumerate(events):
        if i % 5 == 3:  # an event split over two writes
            await resp.write(event[:7])
            await asyncio.sleep(0)
            await resp.write(event[7:])
        elif i % 7 == 2 and i + 1 < len(events):  # two events in one write
            events[i + 1] = event + events[i + 1]
        else:
            await resp.write(event)
    await resp.write_eof()
    return resp


def mixed_requests(rng: random.Random) -> list[tuple[str, str, dict[str, Any]]]:
    out: list[tuple[str, str, dict[str, Any]]] = []
    for i in range(REQUESTS):
        kind = rng.random()
        prompt = f"prompt {i} " + "x" * rng.randrange(0, 3000)
        if kind < 0.45:
            body: dict[str, Any] = {
                "model": "m",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": rng.randrange(1, 40),
                "stream": rng.random() < 0.8,
            }
            if body["stream"] and rng.random() < 0.4:
                body["stream_options"] = {"include_usage": True}
            out.append(
                ("POST", rng.choice(["/v1/chat/completions", "/prefix/v1/chat/completions"]), {"json": body})
            )
        elif kind < 0.65:
            body = {
                "model": "m",
                "prompt": prompt,
                "max_tokens": rng.randrange(1, 20),
                "stream": rng.random() < 0.5,
            }
            out.append(("POST", "/v1/completions", {"json": body}))
        elif kind < 0.72:
            out.append(("POST", "/v1/embeddings", {"json": {"model": "e", "input": prompt}}))
        elif kind < 0.80:
            out.append(("GET", f"/status/{rng.choice([400, 404, 429, 500, 503])}", {}))
        elif kind < 0.86:
            out.append(("GET", f"/big?size={rng.randrange(0, 300_000)}", {}))
        else:
            method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
            out.append(
                (method, f"/echo/{i}?q={i}", {"data": prompt.encode()} if method in ("PUT", "PATCH") else {})
            )
    return out


async def fetch_all(
    base: str, requests: list[tuple[str, str, dict[str, Any]]]
) -> list[tuple[int, list[tuple[str, str]], bytes]]:
    limit = asyncio.Semaphore(32)

    async def one(
        session: aiohttp.ClientSession, method: str, path: str, kwargs: dict[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        async with limit, session.request(method, base + path, **kwargs) as resp:
            data = await resp.read()
            headers = [(k, v) for k, v in resp.headers.items() if k.lower() != "date"]
            return resp.status, headers, data

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        return await asyncio.gather(*(one(session, m, p, kw) for m, p, kw in requests))


def test_thousand_mixed_requests_are_byte_identical(tmp_path: Path) -> None:
    requests = mixed_requests(random.Random(4))

    async def main() -> None:
        async with aiohttp_upstream(deterministic) as upstream:
            with start_proxy(upstream.rstrip("/"), str(tmp_path), admin_listen="") as proxy:
                started = now_ns()
                direct = await fetch_all(upstream, requests)
                proxied = await fetch_all(proxy.url, requests)
                assert now_ns() - started < 90e9
                for i, (want, got) in enumerate(zip(direct, proxied, strict=True)):
                    assert got == want, f"request {i}: {requests[i][:2]}"
                assert sum(1 for status, headers, _ in direct if ("X-Stream", "yes") in headers) > 200
                await asyncio.to_thread(proxy.stop)
                assert not [line for line in proxy.output if "Traceback" in line or "ERROR" in line]

    asyncio.run(main())
    recorded = shapes_of(tmp_path)
    eligible = sum(1 for _, path, _ in requests if path.startswith(("/v1/", "/prefix/v1/")))
    assert len(recorded) == eligible
    assert not any(s.output_estimated for s in recorded if s.stream)
