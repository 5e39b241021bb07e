"""The proxy's lifecycle pieces: start-up refusals, and the timeout task that must never be gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from replayproxy.config import ConfigError
from replayproxy.proxy.forward import TICK_S
from replayproxy.proxy.server import ProxyServer
from tests.cli import run_cli
from tests.proxy.helpers import RawRequest, RawUpstream, proxy, run, settings

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def stalled(request: RawRequest) -> None:
    """Headers and one event, then silence: only the idle timeout ends it."""
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    request.connection.write(SSE_HEAD + b"%x\r\n%b\r\n" % (len(event), event))


async def cut_by_idle_timeout(url: str) -> float:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    return loop.time() - started


def test_a_killed_timeout_task_is_logged_restarted_and_timeouts_still_apply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with RawUpstream(stalled) as up, proxy(up.url, idle_timeout_s=0.3) as px:
            assert px._ticker is not None
            px._ticker.cancel()  # killed from outside
            await asyncio.sleep(3 * TICK_S)
            assert not px._ticker.done()
            assert await cut_by_idle_timeout(px.url) < 10

    run(main())
    assert any("the timeout task ended (cancelled); restarting it" in r.message for r in caplog.records)


def test_a_failing_timeout_sweep_does_not_end_the_task(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with RawUpstream(stalled) as up, proxy(up.url, idle_timeout_s=0.3) as px:
            original = px.forwarder.run_tick
            failures = [1, 1]

            def flaky() -> None:
                if failures:
                    failures.pop()
                    raise OverflowError("a sweep that fails")
                original()

            monkeypatch.setattr(px.forwarder, "run_tick", flaky)
            assert await cut_by_idle_timeout(px.url) < 10
            assert not failures

    run(main())
    assert any("timeout sweep failed (OverflowError)" in r.message for r in caplog.records)


def test_a_trace_dir_that_is_a_regular_file_is_refused_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "traces"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="is not a directory"):
        ProxyServer(settings("http://127.0.0.1:9", blocker))
    command = ["proxy", "--upstream", "http://127.0.0.1:9", "--trace-dir", str(blocker)]
    done = run_cli(*command)
    assert done.returncode == 2
    assert (
        done.stderr.strip() == f"replayproxy proxy: error: trace_dir {blocker} exists and is not a directory"
    )
