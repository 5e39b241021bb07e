"""Scripted seams for the forwarding state machines: links that keep bytes, a pool that lends them.

No sockets and no event loop: a test feeds request bytes to a `ClientSide`, response bytes to the
upstream link it was lent, ticks to the forwarder, and reads what each link was sent (the shape of
httpcore's mock stream).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from replayproxy.proxy.client import ClientSide
from replayproxy.proxy.forward import Forwarder
from replayproxy.proxy.metrics import HotCounters
from replayproxy.proxy.observe import Observer
from replayproxy.proxy.seam import Borrower
from tests.proxy.helpers import settings


@dataclass
class ScriptedLink:
    """A connection as bytes: what was written, whether it was closed, whether reading is paused."""

    sent: bytearray = field(default_factory=bytearray)
    closed: bool = False
    paused: bool = False

    def write(self, data: bytes) -> None:
        assert not self.closed or data == b"", "written after close"
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def pause(self, paused: bool) -> None:
        self.paused = paused


@dataclass
class ScriptedUpstream(ScriptedLink):
    """An upstream connection; `answer` plays the server's bytes to whoever borrowed it."""

    borrower: Borrower | None = None

    def answer(self, pieces: Iterable[bytes]) -> None:
        for piece in pieces:
            assert self.borrower is not None
            self.borrower.upstream_data(piece)

    def lose(self) -> None:
        assert self.borrower is not None
        self.borrower.upstream_lost()


class ScriptedPool:
    """Lends a fresh connection at once (or, with `hold`, when `lend` is called)."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.lent: list[ScriptedUpstream] = []
        self.waiting: list[Borrower] = []
        self.released: list[tuple[ScriptedUpstream, bool]] = []

    def acquire(self, borrower: Borrower) -> None:
        self.waiting.append(borrower)
        if not self.hold:
            self.lend()

    def lend(self) -> ScriptedUpstream:
        conn = ScriptedUpstream(borrower=self.waiting.pop(0))
        self.lent.append(conn)
        conn.borrower.upstream_ready(conn)  # type: ignore[union-attr]
        return conn

    def release(self, conn: Any, reusable: bool, tick: int, streamed: bool = False) -> None:
        self.released.append((conn, reusable))

    def forget(self, borrower: Borrower) -> None:
        self.waiting.remove(borrower)


@dataclass
class Machine:
    forwarder: Forwarder
    pool: ScriptedPool
    link: ScriptedLink
    side: ClientSide

    @property
    def upstream(self) -> ScriptedUpstream:
        [conn] = self.pool.lent
        return conn

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.forwarder.tick += 1
            self.side.tick(self.forwarder.tick, 10**9)


def machine(
    upstream: str = "http://engine:8000",
    observer: Observer | None = None,
    hold: bool = False,
    link: ScriptedLink | None = None,
    **overrides: Any,
) -> Machine:
    forwarder = Forwarder(settings(upstream, **overrides), HotCounters(), observer)
    pool = ScriptedPool(hold)
    forwarder.pool = pool  # type: ignore[assignment]
    link = link if link is not None else ScriptedLink()
    return Machine(forwarder, pool, link, ClientSide(forwarder, link))


def splits(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """`data` cut at the given offsets (any order, repeats and out-of-range ones ignored)."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def two_piece_splits(data: bytes) -> Iterator[list[bytes]]:
    """Every way to cut `data` in two, and `data` whole."""
    yield [data]
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
