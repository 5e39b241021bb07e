"""Owned children: their whole group is stopped on every way out, and a capped run is bounded."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from replayproxy import children
from tests.processes import recorded_pids, survivors


def _recording(pids: Path, tail: str) -> list[str]:
    """A shell that records its pid and its background sleep's, then runs `tail`."""
    return ["sh", "-c", f"echo $$ >> {pids}; sleep 60 & echo $! >> {pids}; {tail}"]


def _wait_for_pids(path: Path, count: int) -> list[int]:
    deadline = time.perf_counter() + 30
    while len(recorded_pids(path)) < count and time.perf_counter() < deadline:
        time.sleep(0.02)
    return recorded_pids(path)


def test_a_capped_run_answers_once_its_child_exits_and_kills_what_it_left(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    started = time.perf_counter()
    done = children.run_capped(_recording(pids, "echo 42"), b"", 30, 100)
    assert done.returncode == 0 and done.stdout == b"42\n"
    assert time.perf_counter() - started < 10  # not the background sleep's 60 s
    recorded = recorded_pids(pids)
    assert len(recorded) == 2 and survivors(recorded) == []


@pytest.mark.parametrize(
    ("argv", "stdin", "message"),
    [
        (["sleep", "60"], b"", "no answer in 0.5 s"),
        (["sh", "-c", "exec >&-; sleep 60"], b"", "no answer in 0.5 s"),  # stdout closed, still running
        (["sleep", "60"], b"x" * 4_000_000, "no answer in 0.5 s"),  # reads nothing: the write cannot block
        (["yes"], b"", "printed more than 1000 bytes"),
        (["cat"], b"y" * 4_000_000, "printed more than 1000 bytes"),
    ],
    ids=["sleeps", "closes-stdout", "ignores-stdin", "yes", "echoes"],
)
def test_a_capped_run_is_bounded(argv: list[str], stdin: bytes, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(children.ChildFailed, match=message):
        children.run_capped(argv, stdin, 0.5, 1000)
    assert time.perf_counter() - started < 10


def test_a_scorer_that_does_not_read_its_input_still_answers() -> None:
    done = children.run_capped(["sh", "-c", "echo 7"], b"z" * 1_000_000, 30, 100)
    assert (done.returncode, done.stdout) == (0, b"7\n")


def test_a_capped_run_stops_when_asked_from_another_thread(tmp_path: Path) -> None:
    pids, stop = tmp_path / "pids", threading.Event()
    timer = threading.Timer(0.5, stop.set)
    timer.start()
    started = time.perf_counter()
    with pytest.raises(children.ChildFailed, match="stopped"):
        children.run_capped(_recording(pids, "wait"), b"", 60, 100, stop)
    timer.join()
    assert time.perf_counter() - started < 10
    assert survivors(recorded_pids(pids)) == []


def test_an_owned_group_is_stopped_when_the_block_raises(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with pytest.raises(KeyboardInterrupt):
        with children.owned(_recording(pids, "wait"), 5.0) as process:
            assert len(_wait_for_pids(pids, 2)) == 2
            raise KeyboardInterrupt
    assert process.returncode == -signal.SIGTERM
    assert survivors(recorded_pids(pids)) == []


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(ready)!r}, 'w'); time.sleep(60)"
    )
    started = time.perf_counter()
    with children.owned([sys.executable, "-c", code], 0.5) as process:
        while not ready.exists():
            time.sleep(0.02)
    assert process.returncode == -signal.SIGKILL
    assert time.perf_counter() - started < 10


def test_sigterm_and_sighup_interrupt_like_ctrl_c() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt):
            with children.signals_interrupt():
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises before this ends
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before
