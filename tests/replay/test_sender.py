"""One sender's run (replayproxy/replay/sender.py): the shared start time."""

from __future__ import annotations

import pytest

from replayproxy import clock
from replayproxy.replay.options import ReplayOptions
from replayproxy.replay.sender import start_ns_for


def test_start_ns_is_soon_by_default_in_the_future_when_asked_and_never_in_the_past() -> None:
    before = clock.now_ns()
    assert start_ns_for(ReplayOptions()) > before
    in_a_minute = (clock.wall_ns() + 60 * 10**9) / 1e9
    start = start_ns_for(ReplayOptions(start_at=f"{in_a_minute:.3f}"))
    assert 55 * 10**9 < start - before < 65 * 10**9  # monotonic, through the wall-clock anchor
    with pytest.raises(ValueError, match="is in the past"):
        start_ns_for(ReplayOptions(start_at="1700000000"))
