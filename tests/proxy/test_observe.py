"""Observer calls on the forwarding path (replayproxy/proxy/observe.py): a failing observer is
counted and logged at most once per interval, never raised into the stream, and logs no payload."""

from __future__ import annotations

import logging

import pytest

from replayproxy.proxy.observe import Capture, RateLimitedLog, guarded


class Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def test_a_failing_observer_is_counted_logged_without_its_message_and_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counted: list[str] = []
    log = RateLimitedLog(10.0, Clock())

    def fail() -> None:
        raise ValueError("user text: secret prompt")

    with caplog.at_level(logging.ERROR, logger="replayproxy.proxy"):
        guarded(fail, counted.append, log)
    assert counted == ["observer"]
    assert caplog.messages == ["observer failed: ValueError; traffic unaffected"]
    assert "secret" not in caplog.text


def test_a_working_observer_costs_no_count() -> None:
    counted: list[str] = []
    ran: list[int] = []
    guarded(lambda: ran.append(1), counted.append, RateLimitedLog(1.0, Clock()))
    assert ran == [1] and counted == []


def test_repeats_are_logged_once_per_interval_with_the_count_not_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = RateLimitedLog(1.0, clock)
    with caplog.at_level(logging.ERROR, logger="replayproxy.proxy"):
        log("disk", "disk full")
        clock.ns = 500_000_000
        log("disk", "disk full")
        log("disk", "disk full")
        log("other", "other failure")  # keys are limited apart
        clock.ns = 1_000_000_000
        log("disk", "disk full")
    assert caplog.messages == ["disk full", "other failure", "disk full (2 similar not logged)"]


def test_a_capture_starts_empty_and_unended() -> None:
    capture = Capture(arrival_ns=5, endpoint="chat", method="POST", path="/v1/chat/completions")
    assert capture.end_ns == -1 and capture.status == 0 and capture.error == ""
    assert capture.pieces == [] and capture.request_body == [] and not capture.body_truncated
    other = Capture(arrival_ns=6, endpoint="chat", method="POST", path="/")
    capture.pieces.append(b"x")
    assert other.pieces == []  # no list shared between captures
