"""The admin listener (proxy/admin.py) over real loopback connections: what it answers, and the bounds
that keep any client from costing the forwarding loop more than a slice (connections, timeouts,
the request budget, the cached /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

from replayproxy.clock import now_ns
from replayproxy.proxy import admin
from replayproxy.proxy.metrics import ProxyMetrics
from tests.proxy.helpers import run

GET = b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n"


def health(
    accepting: bool = True, recording: str = "", upstream: str = "", requires_recording: bool = True
) -> admin.Health:
    async def probe() -> str:
        return upstream

    return admin.Health(lambda: accepting, lambda: recording, probe, requires_recording)


@contextlib.asynccontextmanager
async def serving(
    state: admin.Health | None = None, metrics: ProxyMetrics | None = None, **limits: float
) -> AsyncIterator[admin.AdminServer]:
    server = admin.AdminServer(
        admin.listen("127.0.0.1", 0),
        metrics or ProxyMetrics(),
        state or health(),
        admin.AdminLimits(**limits),
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


async def connect(server: admin.AdminServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return int(head.split(b" ")[1]), await reader.readexactly(length)


async def ask(server: admin.AdminServer, path: bytes) -> tuple[int, bytes]:
    reader, writer = await connect(server)
    try:
        writer.write(GET % path)
        return await asyncio.wait_for(response(reader), 5)
    finally:
        writer.close()


async def closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(timeout_s):
            return await reader.read() == b""
    return False


def test_health_and_readiness_say_what_each_covers() -> None:
    async def answers(state: admin.Health, path: bytes) -> tuple[int, dict[str, str]]:
        async with serving(state) as server:
            status, body = await ask(server, path)
        return status, json.loads(body)

    async def main() -> None:
        assert await answers(health(), b"/healthz") == (200, {"status": "ok", "recording": "ok"})
        assert await answers(health(), b"/readyz") == (
            200,
            {"status": "ready", "upstream": "ok", "recording": "ok"},
        )
        # The upstream down: alive (no restart), but not ready (send no clients here).
        down = health(upstream="status 503")
        assert (await answers(down, b"/healthz"))[0] == 200
        assert await answers(down, b"/readyz") == (
            503,
            {"status": "not ready", "upstream": "down (status 503)", "recording": "ok"},
        )
        stuck = health(recording="stuck: x")
        assert await answers(stuck, b"/healthz") == (200, {"status": "ok", "recording": "failing (stuck: x)"})
        assert (await answers(stuck, b"/readyz"))[0] == 503
        assert (await answers(health(recording="stuck: x", requires_recording=False), b"/readyz"))[0] == 200
        assert (await answers(health(recording="off"), b"/readyz"))[1]["recording"] == "off"
        draining = health(accepting=False)
        assert (await answers(draining, b"/healthz")) == (503, {"status": "draining", "recording": "ok"})
        assert (await answers(draining, b"/readyz"))[1]["status"] == "draining"
        async with serving() as server:
            assert (await ask(server, b"/nothing"))[0] == 404
            reader, writer = await connect(server)
            writer.write(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            assert (await response(reader))[0] == 405
            writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + GET % b"/healthz")  # pipelined
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in head
            assert await closed_within(reader, 5)  # answered the first, then closed
            writer.close()

    run(main())


def test_past_the_connection_cap_accepting_pauses_until_one_closes() -> None:
    async def main() -> None:
        async with serving(max_connections=3) as server:
            held = [await connect(server) for _ in range(3)]
            reader, writer = await connect(server)  # the kernel's backlog takes it
            writer.write(GET % b"/healthz")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    await reader.read(1)
                    raise AssertionError("answered past the connection cap")
            assert len(server.connections) == 3
            held[0][1].close()
            assert (await asyncio.wait_for(response(reader), 5))[0] == 200
            for _, w in [*held[1:], (reader, writer)]:
                w.close()

    run(main())


def test_a_slow_head_and_an_idle_connection_are_closed() -> None:
    async def main() -> None:
        async with serving(header_timeout_s=0.3, idle_timeout_s=0.6, sweep_s=0.05) as server:
            slow_reader, slow = await connect(server)
            slow.write(b"GET /healthz HTTP/1.1\r\nHo")  # and nothing more
            idle_reader, idle = await connect(server)
            idle.write(GET % b"/healthz")
            assert (await response(idle_reader))[0] == 200
            started = now_ns()
            assert await closed_within(slow_reader, 3)
            assert 0.15 < (now_ns() - started) / 1e9 < 2.0
            assert await closed_within(idle_reader, 3)
            assert (now_ns() - started) / 1e9 > 0.45
            assert not server.connections
            slow.close()
            idle.close()

    run(main())


def test_answers_past_the_budget_wait_their_turn() -> None:
    async def main() -> None:
        async with serving(rate=10.0, burst=2) as server:
            started = now_ns()
            statuses = await asyncio.gather(*(ask(server, b"/healthz") for _ in range(7)))
            took_s = (now_ns() - started) / 1e9
        assert [s for s, _ in statuses] == [200] * 7
        assert took_s >= 0.4  # two at once, then one every 0.1 s

    run(main())


def test_metrics_is_rendered_at_most_once_per_ttl() -> None:
    metrics = ProxyMetrics()

    async def main() -> None:
        async with serving(metrics=metrics, metrics_ttl_s=0.3) as server:
            first = (await ask(server, b"/metrics"))[1]
            metrics.hot.client_cancels += 1
            assert (await ask(server, b"/metrics"))[1] == first  # within the TTL: the same bytes
            await asyncio.sleep(0.35)
            later = (await ask(server, b"/metrics"))[1]
        assert b"replayproxy_client_cancels_total 0.0" in first
        assert b"replayproxy_client_cancels_total 1.0" in later

    run(main())
