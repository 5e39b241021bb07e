"""The few numbers printed after a run and kept in the result footer; `replayproxy report` does the rest.

Includes the replayer's own fidelity (schedule lag, requests whose preparation fell behind) and the
warning when it was the bottleneck.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NotRequired, TypedDict

import numpy as np

from replayproxy.results import ReplayResult

LAG_WARN_MS = 5.0  # lag p99 above this: the client, not the target, limited the run


def _ms(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)) / 1e6, 3) if len(values) else None


class Summary(TypedDict):
    """A run's footer (milliseconds rounded to microseconds; shares of 1; None: nothing to measure)."""

    requests: int
    errors: int
    errors_by_class: dict[str, int]
    new_connections: int
    prepared_late: int
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    lag_max_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    input_exact: float | None
    output_exact: float | None
    client_bottleneck: bool
    timing_preserved: NotRequired[bool]  # with --max-concurrency
    recorded_failures_left_out: NotRequired[int]  # the rest from the result file's writer
    lengths: NotRequired[str]  # "exact" or "approximate"
    tokenizer: NotRequired[str | None]
    partial: NotRequired[bool]  # an interrupted run...
    stopped_after_s: NotRequired[float]  # ...stopped this long after its start
    planned_requests: NotRequired[int]


def summarize(results: Sequence[ReplayResult], max_concurrency: int = 0) -> Summary:
    """Counts, lag and TTFT percentiles, length exactness; goes into the footer as is."""
    sent = np.array([r.sent_ns - r.scheduled_ns for r in results if r.sent_ns >= 0], np.int64)
    ok = [r for r in results if not r.error]
    ttft = np.array([r.ttft_ns for r in ok if r.ttft_ns >= 0], np.int64)
    errors = Counter(r.error for r in results if r.error)
    checked_in = [r for r in ok if r.expected_input_tokens > 0 and r.prompt_tokens >= 0]
    checked_out = [r for r in ok if r.expected_output_tokens > 0 and r.completion_tokens >= 0]
    lag_p99 = _ms(sent, 99)
    summary: Summary = {
        "requests": len(results),
        "errors": sum(errors.values()),
        "errors_by_class": dict(sorted(errors.items())),
        "new_connections": sum(r.new_connection for r in results),
        "prepared_late": sum(r.prepared_late for r in results),
        "lag_p50_ms": _ms(sent, 50),
        "lag_p99_ms": lag_p99,
        "lag_max_ms": round(float(sent.max()) / 1e6, 3) if len(sent) else None,
        "ttft_p50_ms": _ms(ttft, 50),
        "ttft_p99_ms": _ms(ttft, 99),
        "input_exact": _share(
            sum(r.prompt_tokens == r.expected_input_tokens for r in checked_in), len(checked_in)
        ),
        "output_exact": _share(
            sum(r.completion_tokens == r.expected_output_tokens for r in checked_out), len(checked_out)
        ),
        "client_bottleneck": lag_p99 is not None and lag_p99 > LAG_WARN_MS,
    }
    if max_concurrency:
        summary["timing_preserved"] = not summary["client_bottleneck"]
    return summary


def failure(summary: Summary, max_error_rate: float) -> str:
    """Why the run counts as failed (no request succeeded, too many errors), or "" when it did not."""
    requests, errors = summary["requests"], summary["errors"]
    classes = ", ".join(f"{k} {v}" for k, v in summary["errors_by_class"].items())
    if requests and errors == requests:
        return f"all {requests} requests failed ({classes})"
    if requests and errors / requests > max_error_rate:
        return (
            f"{errors} of {requests} requests failed ({classes}), "
            f"more than --max-error-rate {max_error_rate:g}"
        )
    return ""


def _share(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def render(summary: Summary, max_concurrency: int = 0) -> str:
    """A short human summary; the first line is the one a script greps."""

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    errors = ", ".join(f"{k} {v}" for k, v in summary["errors_by_class"].items()) or "none"
    lines = [
        f"requests {summary['requests']}  errors {summary['errors']} ({errors})",
        f"schedule lag p50 {fmt(summary['lag_p50_ms'])} ms  p99 {fmt(summary['lag_p99_ms'])} ms  "
        f"max {fmt(summary['lag_max_ms'])} ms",
        f"TTFT p50 {fmt(summary['ttft_p50_ms'])} ms  p99 {fmt(summary['ttft_p99_ms'])} ms",
        f"exact input length {_pct(summary['input_exact'])}  "
        f"exact output length {_pct(summary['output_exact'])}",
    ]
    if summary.get("lengths") == "exact":
        lines.append(f"prompts exact through {summary.get('tokenizer')}")
    elif "lengths" in summary:
        lines.append("prompt lengths approximate: no tokenizer (give --tokenizer PATH)")
    if summary.get("recorded_failures_left_out"):
        lines.append(
            f"{summary['recorded_failures_left_out']} requests that failed when recorded were left out "
            "(--include-failed replays them)"
        )
    if summary["new_connections"]:
        lines.append(f"{summary['new_connections']} requests needed a new connection on the send path")
    if summary.get("prepared_late"):
        lines.append(
            f"warning: preparation fell behind: {summary['prepared_late']} requests were sent late because "
            "their bodies were not ready (their lag counts it); use --workers N or a lower --speed"
        )
    if summary["client_bottleneck"]:
        if max_concurrency:
            lines.append(
                f"warning: timing not preserved: --max-concurrency {max_concurrency} delayed sends "
                f"(lag p99 {fmt(summary['lag_p99_ms'])} ms, max {fmt(summary['lag_max_ms'])} ms)"
            )
        else:
            lines.append(
                f"warning: schedule lag p99 {fmt(summary['lag_p99_ms'])} ms > {LAG_WARN_MS:g} ms: "
                "the client was the bottleneck; use --workers N or a lower --speed"
            )
    return "\n".join(lines)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"
