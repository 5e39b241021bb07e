"""The printed summary and footer: counts, lag and TTFT percentiles, and the bottleneck warning."""

from __future__ import annotations

from dataclasses import replace

from replayproxy.replay import summary
from replayproxy.results import ReplayResult


def result(i: int, lag_ms: float, ttft_ms: float = 20.0, error: str = "", exact: bool = True) -> ReplayResult:
    return ReplayResult(
        index=i, scheduled_ns=i * 1_000_000, sent_ns=i * 1_000_000 + int(lag_ms * 1e6), error=error,
        ttft_ns=int(ttft_ms * 1e6) if not error else -1, expected_input_tokens=10, expected_output_tokens=5,
        prompt_tokens=10 if exact else 11, completion_tokens=5, new_connection=i == 0,
    )  # fmt: skip


def test_counts_percentiles_and_exactness() -> None:
    results = [result(i, 0.1) for i in range(98)] + [
        result(98, 0.2, error="http_5xx"),
        result(99, 0.2, error="reset"),
    ]
    facts = summary.summarize(results)
    assert facts["requests"] == 100 and facts["errors"] == 2
    assert facts["errors_by_class"] == {"http_5xx": 1, "reset": 1}
    assert facts["lag_p50_ms"] == 0.1 and facts["ttft_p50_ms"] == 20.0
    assert facts["input_exact"] == 1.0 and facts["new_connections"] == 1
    assert not facts["client_bottleneck"] and "timing_preserved" not in facts
    text = summary.render(facts)
    assert text.splitlines()[0] == "requests 100  errors 2 (http_5xx 1, reset 1)"
    assert "warning" not in text and "1 requests needed a new connection" in text


def test_a_late_client_is_called_the_bottleneck() -> None:
    facts = summary.summarize([result(i, 8.0 if i % 10 == 0 else 0.1, exact=i % 2 == 0) for i in range(100)])
    assert facts["client_bottleneck"] and facts["input_exact"] == 0.5
    assert "the client was the bottleneck" in summary.render(facts)


def test_max_concurrency_says_timing_was_not_preserved_and_by_how_much() -> None:
    facts = summary.summarize([result(i, 40.0) for i in range(10)], max_concurrency=4)
    assert facts["timing_preserved"] is False
    text = summary.render(facts, max_concurrency=4)
    assert "timing not preserved" in text and "lag p99 40 ms" in text


def test_a_run_fails_when_nothing_succeeded_or_too_much_failed() -> None:
    def facts(requests: int, errors: int) -> dict[str, object]:
        return {
            "requests": requests,
            "errors": errors,
            "errors_by_class": {"http_4xx": errors} if errors else {},
        }

    assert summary.failure(facts(5, 5), 1.0) == "all 5 requests failed (http_4xx 5)"
    assert (
        summary.failure(facts(10, 6), 0.5)
        == "6 of 10 requests failed (http_4xx 6), more than --max-error-rate 0.5"
    )
    assert summary.failure(facts(10, 5), 0.5) == summary.failure(facts(0, 0), 0.5) == ""


def test_requests_whose_bodies_were_late_are_counted_and_warned_about() -> None:
    on_time = [result(i, 0.1) for i in range(10)]
    assert summary.summarize(on_time)["prepared_late"] == 0
    assert "preparation fell behind" not in summary.render(summary.summarize(on_time))
    late = [r if r.index % 5 else replace(r, prepared_late=True) for r in on_time]
    facts = summary.summarize(late)
    assert facts["prepared_late"] == 2
    assert "warning: preparation fell behind: 2 requests were sent late" in summary.render(facts)
