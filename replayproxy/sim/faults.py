"""Seeded fault injection: which requests fail, get throttled, reset or stall, and where.

Every request draws the same number of random values whatever the rates, so a given seed gives the
same faults to the same arrival order even when only one rate changes. Echoed rejections draw from
their own generator, so turning them on leaves the other faults where they were.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from replayproxy.sim.api import ApiError
from replayproxy.sim.config import SimConfig


@dataclass(frozen=True, slots=True)
class Faults:
    """What to do to one request; chunk positions count written events of a stream."""

    error: ApiError | None = None  # answer this instead of generating
    reset_after: int | None = None  # abort the connection after this many events (0: before any)
    stall_after: int | None = None  # pause once after this many events
    stall_s: float = 0.0
    first_byte_delay_s: float = 0.0

    @property
    def name(self) -> str | None:
        """A short label for the truth log."""
        if self.error is not None:
            return f"http_{self.error.status}"
        if self.reset_after is not None:
            return "reset"
        return "stall" if self.stall_after is not None else None


class FaultDrawer:
    def __init__(self, config: SimConfig) -> None:
        self._config = config
        self._rng = random.Random(f"faults-{config.seed}")
        self._echo_rng = random.Random(f"echo-{config.seed}")

    def echo_reject(self) -> bool:
        """Whether this valid request is refused with its own body quoted back (one draw each)."""
        return self._echo_rng.random() < self._config.echo_reject_rate

    def draw(self, events: int) -> Faults:
        """Faults for a request whose answer will have `events` writes (1 for a non-streaming body)."""
        c = self._config
        u_fail, u_throttle, u_reset, u_stall, u_reset_at, u_stall_at = (self._rng.random() for _ in range(6))
        if u_fail < c.fail_rate:
            return Faults(ApiError(500, "simulated internal error", None, "InternalServerError"))
        if u_throttle < c.throttle_rate:
            return Faults(ApiError(429, "simulated rate limit", None, "RateLimitError"))
        reset_after = int(u_reset_at * events) if u_reset < c.reset_rate else None
        stall_after = 1 + int(u_stall_at * max(1, events - 1)) if u_stall < c.stall_rate else None
        return Faults(None, reset_after, stall_after, c.stall_seconds, c.first_byte_delay)
