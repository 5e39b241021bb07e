"""The wire between the preparer process (replay.preparer) and a sender: batches of wire bytes.

The preparer writes, into one pipe per sender, batches of ready-to-write HTTP requests in that
sender's schedule order, then an empty frame. Its writes never block (`FeedWriter`): a frame a
full pipe does not take waits in memory, and once a batch's worth waits the preparer stops planning
until a sender reads, after handing every sender the requests planned for it so far (a sender
must never wait for a request that sits in the preparer because another sender is not reading).
The reading end is non-blocking:
`FeedReader.read` returns what has arrived, never waits, and `Window` (replay.window) decides
when to call it.
"""

from __future__ import annotations

import os
import select
import struct
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import fields
from multiprocessing.connection import Connection as Pipe

import msgpack

from replayproxy.errors import RunAborted
from replayproxy.replay.connection import Target
from replayproxy.replay.prepared import Prepared

BATCH_BYTES = 128 * 1024  # a batch is written once it holds this many wire bytes...
BATCH_REQUESTS = 16  # ...or this many requests, so that reading one stays short (~0.1 ms)
READ_BYTES = 1 << 18  # at most this much is read from the pipe at once
_FIELDS = [f.name for f in fields(Prepared) if f.name != "body"]
_HEADER = struct.Struct("!i")  # multiprocessing.Connection's framing: a signed length, then the bytes


def wire_of(target: Target, headers: Mapping[str, str], prepared: Prepared) -> bytes:
    """The whole HTTP request of `prepared`, ready for `transport.write`."""
    return target.request_bytes(
        "POST", prepared.path, prepared.body, {"Accept": "text/event-stream", **headers}
    )


# What an entry is to the sender that reads it: one of its schedule's requests, a request moved to
# it from another sender's schedule (an edited-reply continuation of a turn it sends: closed loop
# waits for that turn's end, which only it sees), or one of its schedule's moved away (no bytes).
OWN, JOINED, MOVED = 0, 1, 2
Entry = tuple[Prepared, bytes, int]  # the request, its wire bytes, its kind


def encode(entries: Sequence[tuple[Prepared, bytes] | Entry]) -> bytes:
    """A batch of requests as one frame (an entry without a kind is OWN); `decode` undoes it (the
    body travels in the wire bytes)."""
    rows = [[*(getattr(e[0], name) for name in _FIELDS), e[1], e[2] if len(e) > 2 else OWN] for e in entries]
    frame: bytes = msgpack.packb(rows)
    return frame


def decode(batch: bytes) -> list[Entry]:
    """A batch back into requests; bodies live in the wire bytes only (`Prepared.body` is empty)."""
    out = []
    for values in msgpack.unpackb(batch, use_list=False):
        fields = dict(zip(_FIELDS, values[:-2], strict=True))
        out.append((Prepared(body=b"", **fields), values[-2], values[-1]))
    return out


class FeedReader:
    """A sender's end of its pipe from the preparer: non-blocking reads of whole batches."""

    def __init__(self, pipe: Pipe) -> None:
        self._pipe = pipe
        self.fileno = pipe.fileno()
        os.set_blocking(self.fileno, False)
        self._buffer = bytearray()
        self.ended = False

    def read(self) -> list[Entry] | None:
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
                raise RunAborted("request preparation stopped early: the preparer process ended")
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


class FeedWriter:
    """The preparer's ends of the senders' pipes: frames written as far as each pipe takes them,
    the rest kept (in order) until it does."""

    def __init__(self, pipes: Sequence[Pipe]) -> None:
        self._fds = [pipe.fileno() for pipe in pipes]
        for fd in self._fds:
            os.set_blocking(fd, False)
        self._waiting: list[deque[memoryview]] = [deque() for _ in pipes]
        self.waiting_bytes = 0

    @property
    def full(self) -> bool:
        """Whether a batch's worth waits for pipes that do not take it: time to stop planning."""
        return self.waiting_bytes >= BATCH_BYTES

    def put(self, sender: int, frame: bytes) -> None:
        """One frame (multiprocessing.Connection's framing) for `sender`; BrokenPipeError when gone."""
        data = memoryview(_HEADER.pack(len(frame)) + frame)
        self._waiting[sender].append(data)
        self.waiting_bytes += len(data)
        self._write(sender)

    def wait(self, until_empty: bool = False) -> None:
        """Until less than a batch's worth waits (or nothing, `until_empty`), as senders read."""
        while self.waiting_bytes >= (1 if until_empty else BATCH_BYTES):
            poller = select.poll()
            for sender, waiting in enumerate(self._waiting):
                if waiting:
                    poller.register(self._fds[sender], select.POLLOUT)
            for fd, _ in poller.poll():
                self._write(self._fds.index(fd))

    def _write(self, sender: int) -> None:
        waiting = self._waiting[sender]
        while waiting:
            try:
                written = os.write(self._fds[sender], waiting[0])
            except BlockingIOError:
                return
            self.waiting_bytes -= written
            if written < len(waiting[0]):
                waiting[0] = waiting[0][written:]
                return
            waiting.popleft()
