"""/metrics exposes exactly the names of METRICS, with closed-vocabulary labels only."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import aiohttp

from replayproxy.clock import now_ns
from replayproxy.proxy.metrics import METRIC_NAMES, METRICS, Buckets
from tests.proxy.helpers import RawRequest, RawUpstream, proxy, run

ALLOWED_LABELS = {"endpoint", "status_class", "error", "reason", "kind", "outcome", "le"}


def answer(request: RawRequest) -> None:
    status = 500 if b"fail" in request.target else 200
    body = b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}' if status == 200 else b"{}"
    request.connection.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%b" % (status, len(body), body))


def test_metrics_names_labels_and_health(tmp_path: Path) -> None:
    async def main() -> None:
        async with RawUpstream(answer) as up, proxy(up.url, tmp_path) as px:
            async with aiohttp.ClientSession() as session:
                for path in ("/v1/chat/completions", "/v1/fail/chat/completions", "/other"):
                    async with session.post(px.url + path, json={"messages": []}) as resp:
                        await resp.read()
                async with session.get(px.admin_url + "/healthz") as resp:
                    assert resp.status == 200
                    assert await resp.json() == {"status": "ok", "recording": "ok"}
                await _wait_written(session, px.admin_url)
                async with session.get(px.admin_url + "/metrics") as resp:
                    text = await resp.text()
                px.forwarder.drain()
                async with session.get(px.admin_url + "/healthz") as resp:
                    assert resp.status == 503 and (await resp.json())["status"] == "draining"
        families = set(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
        assert {name for name, _ in families} == set(METRIC_NAMES)
        assert families == {(name, kind) for name, kind, _, _ in METRICS}
        labels = set(re.findall(r'[{,]([a-z_]+)="', text))
        assert labels <= ALLOWED_LABELS
        assert 'replayproxy_requests_total{endpoint="chat",status_class="2xx"} 1.0' in text
        assert 'replayproxy_requests_total{endpoint="chat",status_class="5xx"} 1.0' in text
        assert 'replayproxy_requests_total{endpoint="other",status_class="2xx"} 1.0' in text
        assert 'replayproxy_input_tokens_total{endpoint="chat"} 3.0' in text
        assert "replayproxy_trace_files 1.0" in text
        assert "replayproxy_requests_in_flight 0.0" in text
        assert "replayproxy_recording_failing 0.0" in text

    run(main(), timeout_s=60.0)


WRITE_FAILED = re.compile(r"failing \(\w+: \w+Error(: .+)?\)")


def test_health_stays_200_but_says_recording_fails_while_records_are_dropped(tmp_path: Path) -> None:
    trace_dir = tmp_path / "traces"

    async def main() -> tuple[int, dict[str, str], str]:
        async with RawUpstream(answer) as up, proxy(up.url, trace_dir, retry_s=0.05) as px:
            # After a clean start the directory's place is taken by a file: every write now fails.
            trace_dir.write_text("a file where the trace directory should be")
            async with aiohttp.ClientSession() as session:
                deadline = now_ns() + 40 * 10**9  # the recorder process may start slowly on a busy host
                while now_ns() < deadline:
                    async with session.post(px.url + "/v1/chat/completions", json={"messages": []}) as resp:
                        assert resp.status == 200  # live traffic never pays for recording
                        await resp.read()
                    async with session.get(px.admin_url + "/healthz") as resp:
                        status, health = resp.status, await resp.json()
                    if WRITE_FAILED.fullmatch(health["recording"]):
                        break  # (on a starved host "stuck" may come first: the child read nothing)
                    await asyncio.sleep(0.05)
                async with session.get(px.admin_url + "/metrics") as resp:
                    return status, health, await resp.text()

    status, health, metrics = run(main(), timeout_s=60.0)
    assert status == 200 and health["status"] == "ok"
    assert WRITE_FAILED.fullmatch(health["recording"]), health
    assert "replayproxy_recording_failing 1.0" in metrics


async def _wait_written(session: aiohttp.ClientSession, admin_url: str) -> None:
    deadline = now_ns() + 40 * 10**9  # the recorder process reports once it is up
    while now_ns() < deadline:
        async with session.get(admin_url + "/metrics") as resp:
            if "replayproxy_records_written_total 2.0" in await resp.text():
                return
        await __import__("asyncio").sleep(0.05)


def test_buckets_are_inclusive_and_cumulative_like_prometheus_client() -> None:
    buckets = Buckets((0.01, 0.1, 1.0))
    for value in (0.005, 0.01, 0.0100001, 0.1, 5.0):
        buckets.observe(value)
    assert buckets.cumulative() == [("0.01", 2), ("0.1", 4), ("1.0", 4), ("+Inf", 5)]
    assert abs(buckets.sum - 5.1250001) < 1e-9


def test_a_stopped_recorder_process_turns_failing_on_and_recovery_turns_it_off(tmp_path: Path) -> None:
    """SIGSTOP the recorder process under ~100 req/s: records pile up unread, then are dropped;
    /healthz and the gauge say so (liveness stays 200) and /readyz, asked to, stops sending clients here.
    SIGCONT: it catches up, and both go back to ok once the drop window has passed."""

    async def main() -> None:
        async with (
            RawUpstream(answer) as up,
            proxy(
                up.url,
                tmp_path,
                queue_records=50,
                upstream_health_path="/v1/models",
                ready_requires_recording=True,
            ) as px,
            aiohttp.ClientSession() as session,
        ):
            assert px.recorder is not None
            px.recorder.failing_window_ns = 1_000_000_000  # recovery shows within a second
            stop = asyncio.Event()

            async def traffic() -> None:
                while not stop.is_set():
                    async with session.post(px.url + "/v1/chat/completions", json={"messages": []}) as resp:
                        assert resp.status == 200  # live traffic never pays for recording
                        await resp.read()
                    await asyncio.sleep(0.01)

            load = asyncio.ensure_future(traffic())
            try:
                await _gauge_until(session, px.admin_url, "0.0", "replayproxy_records_written_total 0.0")
                pid = px.recorder.child_pid
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                try:
                    stopped = await _health_until(session, px.admin_url, lambda h: h["recording"] != "ok")
                    assert re.fullmatch(r"failing \((stuck: .+|dropping records \(queue_full\))\)", stopped)
                    assert await _gauge_until(session, px.admin_url, "1.0")
                    async with session.get(px.admin_url + "/readyz") as resp:
                        assert resp.status == 503 and (await resp.json())["recording"] == stopped
                    async with session.get(px.admin_url + "/healthz") as resp:
                        assert resp.status == 200
                finally:
                    os.kill(pid, signal.SIGCONT)
                assert await _health_until(session, px.admin_url, lambda h: h["recording"] == "ok") == "ok"
                assert await _gauge_until(session, px.admin_url, "0.0")
                async with session.get(px.admin_url + "/readyz") as resp:
                    assert resp.status == 200
            finally:
                stop.set()
                await load
            text = await (await session.get(px.admin_url + "/metrics")).text()
            dropped = re.search(r'replayproxy_records_dropped_total\{reason="queue_full"\} (\S+)', text)
            assert dropped is not None and float(dropped.group(1)) > 0

    run(main(), timeout_s=90.0)


async def _health_until(
    session: aiohttp.ClientSession, admin_url: str, done: Callable[[dict[str, str]], bool]
) -> str:
    deadline = now_ns() + 30 * 10**9
    while True:
        async with session.get(admin_url + "/healthz") as resp:
            health = await resp.json()
        if done(health) or now_ns() > deadline:
            return str(health["recording"])
        await asyncio.sleep(0.05)


async def _gauge_until(session: aiohttp.ClientSession, admin_url: str, value: str, unless: str = "") -> bool:
    """Scrape until the gauge shows `value` (and the text lacks `unless`)."""
    deadline = now_ns() + 30 * 10**9
    while now_ns() < deadline:
        async with session.get(admin_url + "/metrics") as resp:
            text = await resp.text()
        if f"replayproxy_recording_failing {value}" in text and not (unless and unless in text):
            return True
        await asyncio.sleep(0.05)
    return False
