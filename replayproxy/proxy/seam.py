"""The only I/O the forwarding state machines see: a connection to write to, close, and pause.

The two asyncio protocols (the client's in forward.py, the upstream's in upstream.py) implement
it over sockets; tests implement it over lists of bytes, so exchanges are driven by scripted byte
splits and ticks without a socket (the shape of h11, and of httpcore's mock stream).
"""

from __future__ import annotations

from typing import Protocol

from replayproxy.shape import ErrorClass


class Link(Protocol):
    """One connection as the state machines use it."""

    def write(self, data: bytes) -> None:
        """Queue bytes for the peer (never blocks; back-pressure comes back as pause calls)."""

    def close(self) -> None:
        """Client: close once queued bytes are written. Upstream: abort now (the engine frees the slot)."""

    def pause(self, paused: bool) -> None:
        """Stop (True) or resume (False) reading from the peer."""


class UpstreamLink(Link, Protocol):
    """An upstream connection lent by the pool."""


class Borrower(Protocol):
    """What the pool and an upstream connection report to (an exchange)."""

    def upstream_ready(self, conn: UpstreamLink) -> None: ...
    def upstream_failed(self, error: ErrorClass) -> None: ...
    def upstream_data(self, data: bytes) -> None: ...
    def upstream_lost(self) -> None: ...
    def upstream_pause(self, paused: bool) -> None: ...


class Pool(Protocol):
    """Lends upstream connections (upstream.UpstreamPool; a scripted one in tests)."""

    def acquire(self, borrower: Borrower) -> None: ...
    def release(self, conn: UpstreamLink, reusable: bool, tick: int, streamed: bool = False) -> None: ...
    def forget(self, borrower: Borrower) -> None: ...
