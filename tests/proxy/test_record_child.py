"""The recorder process's loop (proxy/recording/child.py), run on a thread over a real socket pair: every
way the proxy can go — its end reset with unread data (what a SIGKILL leaves), or the process
handed to another parent while something else holds the pipe — ends recording with everything
read written and the footer."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayproxy.clock import Anchor
from replayproxy.proxy.recording import child, wire
from replayproxy.trace import ReadReport, read_trace_files
from tests.proxy.helpers import settings
from tests.proxy.test_record_core import KEY, cap
from tests.trace.helpers import shapes_of


@pytest.fixture(autouse=True)
def _proxy_logger_restored() -> Iterator[None]:
    """`serve` owns its process's logging (lines go to the proxy through the pipe); here it runs in
    the test process, whose other tests read the proxy's log lines."""
    logger = logging.getLogger("replayproxy.proxy")
    propagate = logger.propagate
    yield
    logger.propagate = propagate


def _start(tmp_path: Path, parent: int | None) -> tuple[socket.socket, socket.socket, threading.Thread]:
    ours, theirs = socket.socketpair()
    packer = wire.packer()
    config = wire.config_record(settings("http://127.0.0.1:9", tmp_path / "traces"), KEY, Anchor.take())
    ours.sendall(packer.pack([wire.CONFIG, config]))
    ours.sendall(packer.pack([wire.CAPTURES, [wire.capture_record(cap(i)) for i in range(5)]]))
    thread = threading.Thread(target=child.serve, args=(theirs, parent), daemon=True)
    thread.start()
    return ours, theirs, thread


def _footers(directory: Path) -> int:
    report = ReadReport()
    read_trace_files([directory], report)
    return report.footers


def test_a_reset_pipe_ends_recording_with_everything_read_and_the_footer(tmp_path: Path) -> None:
    ours, theirs, thread = _start(tmp_path, None)
    theirs.sendall(b"a report the proxy never read")  # into our end, unread: closing it now resets
    ours.sendall(wire.packer().pack([wire.CAPTURES, [wire.capture_record(cap(9))]]))
    ours.close()
    thread.join(10)
    theirs.close()
    assert not thread.is_alive()
    assert _footers(tmp_path / "traces") == 1
    assert sorted(s.input_tokens for s in shapes_of(tmp_path / "traces")) == [10, 11, 12, 13, 14, 19]


def test_handed_to_another_parent_it_ends_though_the_pipe_stays_open(tmp_path: Path) -> None:
    ours, theirs, thread = _start(tmp_path, parent=-1)  # -1: never this process's parent
    thread.join(10)
    try:
        assert not thread.is_alive()
        assert _footers(tmp_path / "traces") == 1 and len(shapes_of(tmp_path / "traces")) == 5
    finally:
        ours.close()
        theirs.close()
