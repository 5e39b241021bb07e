"""Streaming preparation: a child process plans and serializes requests, a pipe carries them over.

Preparing every body before the clock starts made the first request wait for the whole trace
and held every body in memory. Here a spawned process walks the planner (replay.plan) in arrival
order and writes the requests one runner sends, as batches of ready-to-write wire bytes, into a
pipe; the pipe's capacity is its only buffer, so when the runner stops reading (its window is
full) the preparer waits. It runs in its own interpreter, so it never holds the send loop's GIL,
on another core where it may, else at a lower priority, so the sender still wakes on time. The reading end is
non-blocking: `FeedReader.read` returns what has arrived, never waits, and `Window`
(replay.window) decides when to call it.
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import signal
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection as Pipe
from typing import Any

import msgpack
import numpy as np

from replayproxy import trace
from replayproxy.replay import flavors
from replayproxy.replay.connection import Target
from replayproxy.replay.plan import Planner, PlanOptions, Prepared, Schedule

BATCH_BYTES = 128 * 1024  # a batch is written once it holds this many wire bytes...
BATCH_REQUESTS = 16  # ...or this many requests, so that reading one stays short (~0.1 ms)
PIPE_BYTES = 1 << 20  # asked of the kernel for the pipe (Linux; the default is 64 KiB)
READ_BYTES = 1 << 18  # at most this much is read from the pipe at once
PREPARER_NICE = 10  # on the sender's only core, the sender wins the CPU whenever it wakes for a send
_FIELDS = [f.name for f in fields(Prepared) if f.name != "body"]
_HEADER = struct.Struct("!i")  # multiprocessing.Connection's framing: a signed length, then the bytes


@dataclass(frozen=True, slots=True)
class FeedSpec:
    """What the preparer process needs: the trace, which rows to plan, which of them to send."""

    traces: tuple[str, ...]
    rows: np.ndarray  # trace rows to plan, in arrival order (every one, so shared prefixes match)
    send: np.ndarray  # positions among the planned requests that this runner sends, ascending
    flavor: flavors.Flavor
    options: PlanOptions
    target: str
    headers: dict[str, str] = field(default_factory=dict)
    schedule: Schedule | None = None  # of every planned request, when the runner has it already


def entries(spec: FeedSpec, cols: trace.Columns | None = None) -> Iterator[tuple[Prepared, bytes]]:
    """The requests at `spec.send`, each with its wire bytes; the others are only planned."""
    cols = cols if cols is not None else trace.load(spec.traces)
    planner = Planner(cols, spec.rows, spec.flavor, spec.options, spec.schedule)
    target = Target.parse(spec.target)
    wanted = np.zeros(len(planner), dtype=bool)
    wanted[spec.send] = True
    last = int(spec.send[-1]) if len(spec.send) else -1
    for position in range(last + 1):
        prepared = planner.next(render=bool(wanted[position]))
        if prepared is not None:
            yield prepared, wire_of(target, spec.headers, prepared)


def wire_of(target: Target, headers: Mapping[str, str], prepared: Prepared) -> bytes:
    """The whole HTTP request of `prepared`, ready for `transport.write`."""
    return target.request_bytes(
        "POST", prepared.path, prepared.body, {"Accept": "text/event-stream", **headers}
    )


def _encode(prepared: Prepared, wire: bytes) -> list[Any]:
    return [*(getattr(prepared, name) for name in _FIELDS), wire]


def decode(batch: bytes) -> list[tuple[Prepared, bytes]]:
    """A batch back into requests; bodies live in the wire bytes only (`Prepared.body` is empty)."""
    out = []
    for values in msgpack.unpackb(batch, use_list=False):
        out.append((Prepared(body=b"", **dict(zip(_FIELDS, values[:-1], strict=True))), values[-1]))
    return out


def _preparer_main(spec: FeedSpec, pipe: Pipe) -> None:
    """Entry point of the preparer process: batches until the last request, then an empty frame.
    Ctrl-C is the runner's to handle: when it stops reading, the closed pipe ends this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == 1:
        with contextlib.suppress(OSError):  # pinned to the sender's only core: let the sender win it
            os.nice(PREPARER_NICE)
    try:
        batch: list[list[Any]] = []
        size = 0
        for prepared, wire in entries(spec):
            batch.append(_encode(prepared, wire))
            size += len(wire)
            if size >= BATCH_BYTES or len(batch) >= BATCH_REQUESTS:
                pipe.send_bytes(msgpack.packb(batch))
                batch, size = [], 0
        if batch:
            pipe.send_bytes(msgpack.packb(batch))
        pipe.send_bytes(b"")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the runner stopped (interrupted or failed): nobody is reading any more
    finally:
        pipe.close()


class FeedReader:
    """The runner's end of one preparer process: non-blocking reads of whole batches."""

    def __init__(self, spec: FeedSpec) -> None:
        context = multiprocessing.get_context("spawn")
        reading, writing = context.Pipe(duplex=False)
        with contextlib.suppress(OSError, AttributeError):  # a bigger pipe where the kernel allows it
            fcntl.fcntl(writing.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._process = context.Process(
            target=_preparer_main, args=(spec, writing), name="replay-preparer", daemon=True
        )
        self._process.start()
        writing.close()
        self._pipe = reading
        self.fileno = reading.fileno()
        os.set_blocking(self.fileno, False)
        self._buffer = bytearray()
        self.ended = False

    def read(self) -> list[tuple[Prepared, bytes]] | None:
        """The requests of the next whole batch that has arrived; None when none has yet."""
        while True:
            batch = self._frame()
            if batch is not None:
                if not batch:
                    self.ended = True
                    return []
                return decode(batch)
            if self.ended:
                return []
            try:
                data = os.read(self.fileno, READ_BYTES)
            except BlockingIOError:
                return None
            if not data:
                self._process.join(5)
                raise RuntimeError(f"request preparation stopped early (exit code {self._process.exitcode})")
            self._buffer += data

    def _frame(self) -> bytes | None:
        if len(self._buffer) < _HEADER.size:
            return None
        (length,) = _HEADER.unpack_from(self._buffer)
        end = _HEADER.size + length
        if len(self._buffer) < end:
            return None
        frame = bytes(self._buffer[_HEADER.size : end])
        del self._buffer[:end]
        return frame

    def close(self) -> None:
        self._pipe.close()
        self._process.join(1)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5)
