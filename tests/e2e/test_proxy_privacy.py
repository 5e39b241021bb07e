"""Privacy: after mixed traffic full of distinctive secrets, no 8-byte piece of any of them is in the
trace files (decompressed), the proxy's log output, or /metrics."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import aiohttp
import orjson

from replayproxy import trace
from replayproxy.trace import ReadReport
from replayproxy.trace.frames import iter_frame_payloads
from tests.proxy.helpers import admin_url
from tests.servers import sim, start_proxy

WINDOW = 8


def secret(label: str) -> str:
    return f"{label}-{secrets.token_hex(12)}-ünï"


def streamed_text(body: str) -> str:
    """The content a chat stream carried, as a client would put it into the next turn."""
    parts = []
    for line in body.splitlines():
        if line.startswith("data: {"):
            choices = orjson.loads(line[6:]).get("choices") or [{}]
            parts.append((choices[0].get("delta") or {}).get("content") or "")
    return "".join(parts)


def windows(text: str) -> set[bytes]:
    data = text.encode()
    return {data[i : i + WINDOW] for i in range(len(data) - WINDOW + 1)}


def test_no_secret_reaches_traces_logs_or_metrics(tmp_path: Path) -> None:
    api_key, tenant, cookie = f"sk-{secrets.token_hex(20)}", secret("tenant"), secret("cookie")
    prompts = [secret(f"prompt{i}") + " " + secret("more") for i in range(6)]
    follow_ups = [secret(f"follow{i}") for i in range(6)]
    replies: list[str] = []
    system, tool, stop, user_id = secret("system"), secret("toolname"), secret("stop"), secret("user")
    request_type = secret("type")  # a body field named like Bailian's `type`: request_type stays unset
    path_secret, query_secret = secrets.token_hex(10), secrets.token_hex(10)
    seen_text: list[str] = []
    headers = {"Authorization": f"Bearer {api_key}", "X-Tenant": tenant, "Cookie": cookie}
    trace_dir = tmp_path / "traces"

    with (
        sim("--speed", "50", "--fail-rate", "0.2", "--reset-rate", "0.1", "--seed", "3") as engine,
        start_proxy(
            engine.url,
            str(trace_dir),
            "--include-endpoints",
            "chat,completions,embeddings,other",
            "--hash-key-file",
            str(tmp_path / "key"),
        ) as proxy,
    ):
        admin = admin_url(proxy)

        async def traffic() -> str:
            async with aiohttp.ClientSession(headers=headers) as session:
                for i, prompt in enumerate(prompts):
                    chat = {
                        "model": "sim-llama-3.1-8b",
                        "stream": i % 2 == 0,
                        "max_tokens": 8,
                        "user": user_id,
                        "type": request_type,
                        "stop": [stop],
                        "tools": [{"type": "function", "function": {"name": tool}}],
                        "tool_choice": "none",  # a text reply, which the second turn quotes as content
                        "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": prompt},
                        ],
                    }
                    for url in (proxy.url + "/v1/chat/completions", proxy.url + "/v1/completions"):
                        body = (
                            chat
                            if "chat" in url
                            else {"model": chat["model"], "prompt": prompt, "max_tokens": 5}
                        )
                        try:
                            async with session.post(url, json=body) as resp:
                                seen_text.append((await resp.read()).decode("utf-8", "replace"))
                                ok = resp.status == 200
                        except aiohttp.ClientPayloadError:
                            continue  # the sim's injected resets
                        if "chat" in url and chat["stream"] and ok:  # a second turn quoting the reply
                            reply = streamed_text(seen_text[-1])
                            replies.append(reply)
                            turn = [
                                {"role": "assistant", "content": reply},
                                {"role": "user", "content": follow_ups[i]},
                            ]
                            second = {**chat, "messages": [*chat["messages"], *turn]}
                            try:
                                async with session.post(url, json=second) as resp:
                                    seen_text.append((await resp.read()).decode("utf-8", "replace"))
                            except aiohttp.ClientPayloadError:
                                pass
                async with session.get(f"{proxy.url}/{path_secret}/v1/models?token={query_secret}") as resp:
                    await resp.read()
                async with session.get(admin + "/metrics") as resp:
                    return await resp.text()

        metrics = asyncio.run(traffic())
        assert proxy.stop() == 0

    report = ReadReport()
    payloads = b"".join(
        payload
        for path in sorted(trace_dir.glob("*.rpt"))
        for payload in map(bytes, iter_frame_payloads(path.read_bytes(), str(path), report))
    )
    assert len(payloads) > 1000 and b"footer" in payloads
    logs = "\n".join(proxy.output).encode()
    secrets_all = [api_key, tenant, cookie, system, tool, stop, user_id, path_secret, query_secret, *prompts]
    secrets_all.append(request_type)
    secrets_all += [*follow_ups, *(r for r in replies if len(r) >= WINDOW)]
    cols = trace.load(sorted(trace_dir.glob("*.rpt")))
    assert replies and int((cols.turn > 0).sum()) >= 1  # linked turns were recorded, by hashes only
    assert set(cols.request_type.tolist()) == {""}  # the proxy records no request class
    assert set(cols.usage_source.tolist()) <= {"", "usage", "timings"}  # a closed set: never response text
    assert "usage" in set(cols.usage_source.tolist())
    generated = [text for text in seen_text if '"choices"' in text]
    assert len(generated) >= 6
    completions = [
        orjson.loads(line[6:])["choices"][0].get("text", "")
        for t in generated
        for line in t.splitlines()
        if line.startswith("data: {") and '"text"' in line
    ]
    for value in secrets_all + [c for c in completions if len(c) >= WINDOW]:
        for piece in windows(value):
            assert piece not in payloads, f"{piece!r} of a secret is in a trace file"
            assert piece not in logs, f"{piece!r} of a secret is in the proxy's output"
            assert piece not in metrics.encode(), f"{piece!r} of a secret is in /metrics"
