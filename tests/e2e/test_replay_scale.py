"""A trace whose bodies do not fit the replayer's memory limit still replays, every request on time.

The replayer runs in a subprocess whose data segment is limited (RLIMIT_DATA, inherited by its
preparer): preparing the whole trace up front needs more than the limit and fails, streaming
preparation holds only its window and sends every request, none of them late for its body. In
open loop, and in closed loop (sessions of three turns, each later turn due after the one before).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replayproxy.results import load_results
from replayproxy.shape import RequestShape
from tests.replay import traces
from tests.replay.sse_server import Server, in_thread, sse_answer

pytestmark = pytest.mark.slow

_MODELS_BODY = b'{"data":[{"id":"big","owned_by":"vllm"}]}'
MODELS = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(_MODELS_BODY), _MODELS_BODY)
REQUESTS = 300
INPUT_TOKENS = 100_000  # about 590 KB of token ids per body: 177 MB for the whole trace
RATE = 24.0  # requests/s: a 12.5 s trace
LIMIT_BYTES = 280 << 20  # the replayer's (and its preparer's) data segment limit: ~210 MB idle


def server() -> contextlib.AbstractContextManager[Server]:
    """A loopback server in a thread that answers each POST with a short stream and keeps no bodies."""

    def respond(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
        writer.write(MODELS if request.startswith(b"GET") else sse_answer(2))

    return in_thread(respond, keep=False)


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (LIMIT_BYTES, LIMIT_BYTES))


def replay(trace: Path, url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable, "-m", "replayproxy", "replay", str(trace), "--target", url, "-o", str(out),
        "--flavor", "vllm", "--no-calibrate", "--allow-approximate", "--progress", "none",
        "--prepare-window", "4", "--prepare-memory", "32", *extra,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300, preexec_fn=limited)


TURNS = 3
THINK_NS = 500_000_000


def shapes(sessions: str) -> list[RequestShape]:
    """Arrivals at RATE; in closed loop, sessions of TURNS turns (each a gap of 1 / RATE after the
    previous turn's recorded end) interleaved at that rate."""
    if sessions == "open":
        return [
            RequestShape(int(i * 1e9 / RATE), "completions", "big", True, INPUT_TOKENS, 2)
            for i in range(REQUESTS)
        ]
    out = []
    for s in range(REQUESTS // TURNS):
        for turn in range(TURNS):
            offset = int(s * TURNS * 1e9 / RATE) + turn * (THINK_NS + 10_000_000)
            out.append(
                RequestShape(
                    offset,
                    "completions",
                    "big",
                    True,
                    INPUT_TOKENS,
                    2,
                    e2e_ns=10_000_000,
                    session=100 + s,
                    turn=turn,
                    think_ns=THINK_NS if turn else -1,
                )  # fmt: skip
            )
    return sorted(out, key=lambda shape: shape.offset_ns)


@pytest.mark.serial  # a schedule-lag bound in milliseconds
@pytest.mark.parametrize("sessions", ["open", "closed"])
def test_a_trace_bigger_than_the_memory_limit_replays_to_the_end_on_schedule(
    tmp_path: Path, sessions: str
) -> None:
    trace = traces.write(tmp_path / "big.rpt", shapes(sessions))
    assert REQUESTS * INPUT_TOKENS * 5 > LIMIT_BYTES // 2  # each token id takes 5-6 bytes of JSON
    with server() as running:
        upfront = replay(trace, running.url, tmp_path / "upfront.rpr", "--prepare", "upfront")
        # out of memory: a MemoryError, a thread whose stack could not be mapped, or a crash where
        # C code could not allocate
        out_of_memory = ("MemoryError", "can't start new thread")
        failed = upfront.returncode < 0 or any(m in upfront.stderr for m in out_of_memory)
        assert failed, upfront.stderr[-2000:]
        streamed = replay(trace, running.url, tmp_path / "streamed.rpr")
    assert streamed.returncode == 0, streamed.stderr[-2000:]
    result = load_results([tmp_path / "streamed.rpr"])[0]
    assert len(result.column("index")) == REQUESTS
    assert result.header.pre_run["sessions"] == sessions
    if sessions == "closed":  # every later turn waited for the one before it
        assert int((result.column("after") >= 0).sum()) == REQUESTS - REQUESTS // TURNS
    assert not result.column("error").any()
    assert not result.column("prepared_late").any()  # no body was missing at its deadline
    lag_ms = (result.column("sent_ns") - result.column("scheduled_ns")) / 1e6
    # generous (a busy host): a send loop blocked by reading bodies would miss by seconds
    assert float(np.percentile(lag_ms, 99)) < 250.0
