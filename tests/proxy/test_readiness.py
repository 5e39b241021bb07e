"""Readiness (proxy/readiness.py and /readyz): the upstream answers its health path, asked on a fresh
connection at most once per second; a refused connect, a 5xx and silence are not ready."""

from __future__ import annotations

import asyncio
import socket

import aiohttp

from replayproxy.proxy import readiness
from replayproxy.proxy.readiness import UpstreamProbe
from tests.proxy.helpers import RawRequest, RawUpstream, header, proxy, run


def answering(status: int) -> RawUpstream:
    def script(request: RawRequest) -> None:
        request.connection.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % status)

    return RawUpstream(script)


def test_any_status_below_500_is_ready_and_the_path_follows_the_upstream_prefix() -> None:
    async def main() -> None:
        for status, expected in ((200, ""), (404, ""), (401, ""), (503, "status 503"), (500, "status 500")):
            async with answering(status) as up:
                url = up.url.replace("http://", "http://user:secret@") + "/api/"
                assert await UpstreamProbe(url, "/health").check() == expected
                [request] = up.requests
                assert request.target == b"/api/health"
                assert header(request.headers, b"host") == up.url.removeprefix("http://").encode()

    run(main())


def test_refused_and_silent_upstreams_are_not_ready() -> None:
    async def main() -> None:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        assert await UpstreamProbe(f"http://127.0.0.1:{port}", "/health").check() == (
            "unreachable (ConnectionRefusedError)"
        )
        async with RawUpstream(lambda request: None) as silent:
            assert await UpstreamProbe(silent.url, "/health").check() == (
                f"no answer within {readiness.TIMEOUT_S:g} s"
            )

    run(main())


def test_one_probe_answers_every_question_within_the_cache_time() -> None:
    async def main() -> None:
        async with answering(200) as up:
            probe = UpstreamProbe(up.url, "/health")
            assert await asyncio.gather(*(probe.check() for _ in range(5))) == [""] * 5
            assert await probe.check() == ""
            assert len(up.requests) == 1
            await asyncio.sleep(readiness.CACHE_S + 0.1)
            await probe.check()
            assert len(up.requests) == 2

    run(main())


def test_readyz_follows_the_upstream_while_healthz_stays_alive() -> None:
    state = {"status": 503}

    def script(request: RawRequest) -> None:
        status = state["status"] if request.target == b"/health" else 200
        request.connection.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % status)

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px, aiohttp.ClientSession() as session:
            async with session.get(px.admin_url + "/readyz") as resp:
                assert resp.status == 503
                assert await resp.json() == {
                    "status": "not ready",
                    "upstream": "down (status 503)",
                    "recording": "off",
                }
            async with session.get(px.admin_url + "/healthz") as resp:
                assert resp.status == 200
            state["status"] = 200  # the model has loaded
            await asyncio.sleep(readiness.CACHE_S + 0.1)
            async with session.get(px.admin_url + "/readyz") as resp:
                assert resp.status == 200 and (await resp.json())["status"] == "ready"

    run(main())
