"""Same trace and seed -> byte-identical request bodies, captured at a raw aiohttp server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
from aiohttp import web

from replayproxy.cli import main
from replayproxy.sim import tokenizer
from replayproxy.sim.thread import serving_in_thread
from tests.replay import traces

MODELS = {"object": "list", "data": [{"id": traces.SIM_MODEL, "object": "model", "owned_by": "vllm"}]}


class Capture:
    """A raw aiohttp server in a thread: records streaming request bodies, answers like an engine."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.url = ""

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.paths.append(f"{request.method} {request.path}")
        if request.method == "GET":
            return web.json_response(MODELS if request.path == "/v1/models" else {"version": "capture-1"})
        raw = await request.read()
        if not raw:
            return web.Response()
        body = orjson.loads(raw)
        if "messages" in body:
            prompt = len(tokenizer.render_chat([(m["role"], m["content"]) for m in body["messages"]]))
        else:
            prompt = (
                len(body["prompt"]) if isinstance(body["prompt"], list) else 1 + len(body["prompt"].split())
            )
        usage = {"prompt_tokens": prompt, "completion_tokens": body["max_tokens"]}
        if not body.get("stream"):
            return web.json_response({"choices": [{"message": {"content": "x"}}], "usage": usage})
        self.bodies.append(raw)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')
        await response.write(b'data: {"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\ndata: [DONE]\n\n")
        return response


@contextlib.contextmanager
def capture_server() -> Iterator[Capture]:
    capture = Capture()

    @contextlib.asynccontextmanager
    async def serve() -> AsyncIterator[str]:
        runner = web.ServerRunner(web.Server(capture.handle))
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            yield f"http://127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await runner.cleanup()

    with serving_in_thread(serve) as capture.url:
        yield capture


def run(trace: Path, url: str, out: Path, seed: str) -> None:
    assert (
        main(
            [
                "replay",
                str(trace),
                "--target",
                url,
                "-o",
                str(out),
                "--flavor",
                "vllm",
                "--allow-approximate",  # the capture server has no tokenizer endpoint
                "--quiet",
                "--seed",
                seed,
                "--speed",
                "10",
            ]
        )
        == 0
    )


def test_two_runs_with_one_seed_send_identical_bytes(tmp_path: Path) -> None:
    trace = traces.write_synthetic(
        tmp_path / "b.rpt",
        requests=60,
        rate_rps=50.0,
        prefix_groups=2,
        prefix_len_tokens=64,
        sessions_share=0.5,
        think_s=0.1,
        input_len="uniform:20,200",
        output_len="uniform:2,9",
    )
    captured = []
    for i, seed in enumerate(("7", "7", "8")):
        with capture_server() as server:
            run(trace, server.url, tmp_path / f"{i}.rpr", seed)
        assert len(server.bodies) == 60
        assert "POST /reset_prefix_cache" in server.paths
        captured.append(sorted(server.bodies))
    assert captured[0] == captured[1]
    assert not set(captured[0]) & set(captured[2])
