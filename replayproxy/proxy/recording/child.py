"""The recorder process: reads captures from the proxy's pipe, records them, reports back.

Started by recorder.py with one end of a socket pair; everything it knows comes through it, the
hash key included (never argv or the environment). It runs at a lower CPU priority so that on a
shared core the forwarding loop comes first, ignores the terminal's and the service manager's
signals (the proxy decides when recording ends: after draining, with a `close` message), and ends
when the proxy goes, so it never outlives it: the pipe's end, a reset (a killed proxy leaves unread
reports in its end of the pipe, and the kernel then resets it), any read error, or being handed to
another parent all mean "write what you hold, close the trace file with its footer, and exit".
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
from typing import Any, cast

import msgpack

from replayproxy.clock import now_ns
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.proxy.recording import wire
from replayproxy.proxy.recording.core import TraceRecorder
from replayproxy.proxy.recording.tally import Tally
from replayproxy.proxy.settings import parse_cpus

NICE = 10  # below the proxy's priority: recording waits, forwarding does not
POLL_S = 0.02  # the writer's flush and rotation clocks are looked at this often while idle
REPORT_NS = 100_000_000  # counts go back to the proxy at most every 0.1 s
_READ_BYTES = 1 << 20  # one reused buffer: a fresh 1 MiB bytes per read cost an mmap, mremap and munmap


class _ToTally(logging.Handler):
    """Log lines travel to the proxy with the counts, and are logged there as its own."""

    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self._tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        self._tally.logs.append((record.levelno, record.getMessage()))


def serve(sock: socket.socket, parent: int | None = None) -> None:
    """Record until the proxy says `close` or goes away; then flush, report, return. `parent`: the
    proxy's pid; this process is handed to another parent (init) when the proxy dies."""
    reader = wire.unpacker()
    packer = wire.packer()
    tally = Tally()
    handler = _ToTally(tally)
    logger = logging.getLogger("replayproxy.proxy")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        config = _first_message(sock, reader)
        if config is None:
            return
        settings, key, anchor = wire.config_from(config)
        _place(settings.recorder_cpus)
        recorder = TraceRecorder(
            settings, PromptHasher(key, settings.tokenizer, settings.block_size), anchor, tally
        )
        recorder.start()
        try:
            _record(sock, reader, packer, recorder, parent)
        finally:  # whatever ended it, a failure included: what is held is written, with the footer
            recorder.close()
            _send(sock, packer, tally)
    finally:
        logger.removeHandler(handler)


def _place(recorder_cpus: str) -> None:
    """Run on the CPUs asked for; by default stay on the proxy's (inherited). One that cannot be
    used here (a cpuset without it) is logged and the recorder records where it is."""
    cpus = parse_cpus(recorder_cpus, "recorder_cpus")
    if not cpus:
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:
        logging.getLogger("replayproxy.proxy").warning(
            "recorder_cpus %s cannot be used here (%s); the recorder process runs on the proxy's CPUs",
            recorder_cpus,
            e.strerror or type(e).__name__,
        )


def _record(
    sock: socket.socket,
    reader: msgpack.Unpacker,
    packer: msgpack.Packer,
    recorder: TraceRecorder,
    parent: int | None,
) -> None:
    """The loop: batches from the pipe to the trace, reports back every REPORT_NS."""
    tally = recorder.tally
    reported = 0
    buffer = memoryview(bytearray(_READ_BYTES))
    open_ = True
    while open_:
        captures: list[Capture] = []
        rotate = False
        readable, _, _ = select.select([sock], [], [], POLL_S)
        if readable:
            size = _read(sock, buffer)
            open_ = size > 0  # 0: the proxy is gone
            reader.feed(buffer[:size])  # feed copies: the buffer is free again at once
        elif parent is not None and os.getppid() != parent:
            open_ = False  # the proxy died and something else still holds its end of the pipe
        for kind, payload in reader:
            if kind == wire.CAPTURES:
                captures.extend(map(wire.capture_from, payload))
            elif kind == wire.ROTATE:
                rotate = True
            elif kind == wire.CLOSE:
                open_ = False
        if captures:
            tally.received += len(captures)
            recorder.record(captures)
        recorder.idle(rotate)
        if tally.changed() and (rotate or now_ns() - reported >= REPORT_NS):
            reported = now_ns()
            _send(sock, packer, tally)


def _read(sock: socket.socket, buffer: memoryview) -> int:
    """Bytes read into `buffer`; 0 when the proxy is gone. What it wrote before dying is still read:
    the kernel reports a reset only after the data queued ahead of it."""
    try:
        return sock.recv_into(buffer)
    except OSError:
        return 0


def _first_message(sock: socket.socket, reader: msgpack.Unpacker) -> dict[str, Any] | None:
    """The config, which the proxy writes before anything else; None if the pipe closed first."""
    while True:
        for kind, payload in reader:
            if kind != wire.CONFIG:
                raise ValueError(f"recorder process: expected the config first, got {kind!r}")
            return cast(dict[str, Any], payload)
        try:
            data = sock.recv(_READ_BYTES)
        except OSError:
            return None
        if not data:
            return None
        reader.feed(data)


def _send(sock: socket.socket, packer: msgpack.Packer, tally: Tally) -> None:
    try:
        sock.sendall(packer.pack([wire.TALLY, tally.take().to_record()]))
    except OSError:
        pass  # the proxy is gone: nobody is left to tell; the trace is what counts


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    try:
        os.nice(NICE)
    except OSError:
        pass  # not permitted here: record at the proxy's priority
    with socket.socket(fileno=int(sys.argv[1])) as sock:
        serve(sock, os.getppid())


if __name__ == "__main__":
    main()
