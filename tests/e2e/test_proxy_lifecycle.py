"""The proxy process: SIGTERM drains in-flight streams and closes the trace; SIGHUP rotates; an unwritable
or full trace directory leaves traffic untouched and shows in /metrics and one log line."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from replayproxy.trace import ReadReport, load, read_trace_files
from tests.proxy.helpers import admin_url, children_of, ended
from tests.servers import sim, start_proxy
from tests.trace.helpers import shapes_in

CHAT = {
    "model": "sim-llama-3.1-8b",
    "messages": [{"role": "user", "content": "Count slowly."}],
    "max_tokens": 30,
    "ignore_eos": True,
    "stream": True,
}


async def stream_all(url: str, n: int, started: asyncio.Event | None = None) -> list[bytes]:
    async with aiohttp.ClientSession() as session:
        first = asyncio.Semaphore(0)

        async def one() -> bytes:
            async with session.post(url + "/v1/chat/completions", json=CHAT) as resp:
                body = await resp.content.readuntil(b"\n\n")
                first.release()
                return body + await resp.read()

        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        for _ in range(n):
            await first.acquire()
        if started is not None:
            started.set()
        return await asyncio.gather(*tasks)


def test_sigterm_drains_in_flight_streams_and_completes_the_trace(tmp_path: Path) -> None:
    with sim("--speed", "1", "--step-base-ms", "25") as engine, start_proxy(engine.url, tmp_path) as proxy:

        async def main() -> list[bytes]:
            started = asyncio.Event()
            streams = asyncio.ensure_future(stream_all(proxy.url, 8, started))
            await started.wait()
            proxy.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            async with aiohttp.ClientSession() as session:
                with pytest.raises(aiohttp.ClientConnectionError):  # no longer accepting
                    await session.get(proxy.url + "/v1/models")
            return await streams

        _wait(lambda: len(children_of(proxy.process.pid)) == 1)
        recorders = children_of(proxy.process.pid)
        bodies = asyncio.run(main())
        assert proxy.process.wait(20) == 0
    assert len(recorders) == 1 and all(ended(pid) for pid in recorders)  # stopped with the proxy
    assert all(body.endswith(b"data: [DONE]\n\n") and body.count(b'"content"') == 31 for body in bodies)
    columns = load(tmp_path)
    report = columns.report
    shapes = shapes_in(columns)
    assert report.footers == 1 and not report.warnings
    assert len(shapes) == 8 and {(s.output_tokens, s.error) for s in shapes} == {(30, "")}


def test_sighup_rotates_the_trace_file(tmp_path: Path) -> None:
    with sim("--speed", "50") as engine, start_proxy(engine.url, tmp_path) as proxy:
        short = {**CHAT, "max_tokens": 2}

        async def send() -> None:
            async with aiohttp.ClientSession() as session:
                async with session.post(proxy.url + "/v1/chat/completions", json=short) as resp:
                    await resp.read()

        asyncio.run(send())
        _wait(lambda: len(list(tmp_path.glob("*.rpt"))) == 1)
        proxy.process.send_signal(signal.SIGHUP)
        _wait(lambda: _footers(tmp_path) == 1)
        asyncio.run(send())
        proxy.stop()
    assert len(list(tmp_path.glob("*.rpt"))) == 2 and _footers(tmp_path) == 2


def test_the_recorder_process_never_outlives_the_proxy(tmp_path: Path) -> None:
    """Killed outright (no drain, no close), the proxy leaves no orphan: its recorder process sees
    the pipe close, writes what it holds (footer included) and exits."""
    with (
        sim("--speed", "50") as engine,
        start_proxy(engine.url, tmp_path, "--flush-interval-s", "30") as proxy,
    ):
        short = {**CHAT, "max_tokens": 2, "stream": False}

        async def send() -> None:
            async with aiohttp.ClientSession() as session:
                for _ in range(5):
                    async with session.post(proxy.url + "/v1/chat/completions", json=short) as resp:
                        await resp.read()

        asyncio.run(send())
        _wait(lambda: len(children_of(proxy.process.pid)) == 1)
        recorders = children_of(proxy.process.pid)
        _wait(lambda: len(list(tmp_path.glob("*.rpt"))) == 1)  # its five records are in its hands
        proxy.process.kill()
        proxy.process.wait(10)
        _wait(lambda: ended(recorders[0]))
    assert _footers(tmp_path) == 1 and len(shapes_in(load(tmp_path))) == 5


def _footers(directory: Path) -> int:
    report = ReadReport()
    with contextlib.suppress(ValueError):
        read_trace_files([directory], report)
    return report.footers


def _wait(condition: object, timeout_s: float = 10.0) -> None:
    async def poll() -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():  # type: ignore[operator]
                await asyncio.sleep(0.05)

    asyncio.run(poll())


@contextlib.contextmanager
def mounted(target: Path, *options: str) -> Iterator[bool]:
    """Mount (tmpfs, or a read-only bind of itself) where permitted; yields whether it worked."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *options, str(target)], capture_output=True, check=False).returncode == 0
    try:
        yield done
    finally:
        if done:
            subprocess.run(["umount", str(target)], capture_output=True, check=False)


@pytest.mark.parametrize("case", ["blocked", "read-only", "full"])
def test_recording_failures_leave_traffic_intact(tmp_path: Path, case: str) -> None:
    trace_dir = tmp_path / "traces"
    kind = {"blocked": "io", "read-only": "permission", "full": "disk_full"}[case]
    options = {
        "blocked": None,
        "read-only": ("-o", "bind,ro", str(tmp_path / "traces")),
        "full": ("-t", "tmpfs", "-o", "size=8k", "tmpfs"),
    }[case]
    if options is None:  # a regular file where the directory should be is refused at start
        trace_dir.write_text("a file where the trace directory should be")
        refused = subprocess.run(
            [sys.executable, "-m", "replayproxy", "proxy", "--upstream", "http://127.0.0.1:9"]
            + ["--trace-dir", str(trace_dir)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "is not a directory" in refused.stderr
        return
    else:
        context = mounted(trace_dir, *options)
    with context as ready:
        if not ready:
            pytest.skip(f"cannot mount for the {case} case here (needs root)")
        prompt = {
            **CHAT,
            "stream": False,
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "long prompt " * 800}],
        }
        with (
            sim("--speed", "50") as engine,
            start_proxy(engine.url, trace_dir, "--flush-interval-s", "0.05") as proxy,
        ):

            async def main() -> str:
                """Requests until the failure is counted: the recorder process writes them in batches
                of whatever arrived meanwhile, so how many fill the disk varies."""
                async with aiohttp.ClientSession() as session, asyncio.timeout(60):
                    for i in itertools.count():
                        async with session.post(proxy.url + "/v1/chat/completions", json=prompt) as resp:
                            assert (
                                resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 3
                            )
                        await asyncio.sleep(0.01)
                        if i >= 40 and i % 5 == 0:
                            async with session.get(admin_url(proxy) + "/metrics") as resp:
                                text = await resp.text()
                            if f'replayproxy_recorder_errors_total{{kind="{kind}"}} 1.0' in text:
                                return text
                raise AssertionError("unreachable")

            metrics = asyncio.run(main())
            proxy.stop()
        errors = [line for line in proxy.output if "trace writing failed" in line]
        assert len(errors) == 1, proxy.output  # once per interval, however many records failed
        assert f'replayproxy_recorder_errors_total{{kind="{kind}"}} 1.0' in metrics
        assert 'replayproxy_records_dropped_total{reason="writer_error"} 0.0' not in metrics
        assert not [line for line in proxy.output if "Traceback" in line]
