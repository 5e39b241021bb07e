"""What the forwarding path hands to observers: references to the bytes it already has, plus times.

The hot path fills a `Capture` only for exchanges an observer asked for (sampling happens at the
request head), so unobserved traffic pays nothing. Bytes objects are immutable, so keeping a
reference is the copy. Observer calls go through `guarded`, which counts and rate-limits failures
and never lets them reach the stream (DESIGN.md: the proxy fails open).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from replayproxy.clock import now_ns
from replayproxy.shape import Endpoint, ErrorClass

_log = logging.getLogger("replayproxy.proxy")


@dataclass(slots=True)
class Capture:
    """One observed exchange; times are monotonic ns (replayproxy.clock.now_ns)."""

    arrival_ns: int
    endpoint: Endpoint
    method: str
    path: str  # without query string; used only to classify, never recorded
    limit_bytes: int = 1 << 62  # response bytes kept at most (max_captured_response_bytes)
    request_body: list[bytes] = field(default_factory=list)
    request_json: object = None  # the body as usage injection parsed it, so the recorder need not again
    request_bytes: int = 0
    body_truncated: bool = False  # more than max_buffered_body_bytes: the shape is minimal
    injected_usage: bool = False  # the proxy added stream_options.include_usage
    status: int = 0
    event_stream: bool = False  # response Content-Type is text/event-stream
    pieces: list[bytes] = field(default_factory=list)  # decoded upstream body, as it arrived
    piece_ns: list[int] = field(default_factory=list)
    response_bytes: int = 0
    response_truncated: bool = False
    end_ns: int = -1  # response complete, cut, or cancelled
    error: ErrorClass = ""


class Observer(Protocol):
    """Something that wants copies of exchanges (the recorder)."""

    def wants(self, endpoint: str) -> bool:
        """Decide at the request head whether to capture this exchange (sampling, endpoint filter)."""

    def finished(self, capture: Capture) -> None:
        """The exchange ended; must return at once (hand the capture to another thread)."""


class RateLimitedLog:
    """Logs a repeated failure at most once per interval, with the count of the ones not shown."""

    def __init__(self, interval_s: float, clock: Callable[[], int] = now_ns) -> None:
        self._interval_ns = int(interval_s * 1e9)
        self._clock = clock
        self._last: dict[str, int] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, key: str, message: str) -> None:
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_ns:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        self._last[key] = now
        hidden = self._suppressed.pop(key, 0)
        _log.error("%s%s", message, f" ({hidden} similar not logged)" if hidden else "")


def guarded(call: Callable[[], object], count: Callable[[str], None], log: RateLimitedLog) -> None:
    """Run an observer hook; any exception is counted and logged (type only: no payloads), never raised."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 — fail open: recording must never break forwarding
        count("observer")
        log("observer", f"observer failed: {type(e).__name__}; traffic unaffected")
