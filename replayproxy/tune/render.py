"""Tune's text output: every configuration in one table, then each engine's best against the others."""

from __future__ import annotations

import math

from replayproxy.tune.fit import TraceFacts
from replayproxy.tune.store import Outcome


def table(outcomes: list[Outcome], facts: TraceFacts) -> str:
    """One row per configuration: its answer (highest rate under the SLO), the figures there, its fate."""
    header = ("engine", "configuration", "status", "max offered req/s under SLO", "achieved req/s",
              "TTFT p95 ms", "TPOT p95 ms", "errors", "start s")  # fmt: skip
    rows = [header]
    for o in outcomes:
        rows.append(
            (
                o.engine,
                o.config,
                _status(o),
                _rate(o, facts),
                _number(o.at_best("requests_per_s"), "{:.3g}"),
                _number(o.at_best("ttft_p95_ms")),
                _number(o.at_best("tpot_p95_ms")),
                _percent(o.at_best("error_rate")),
                _number(o.start_s, "{:.1f}"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {o.engine}[{o.config}]: {o.reason}{_last_line(o.log_tail)}" for o in outcomes if o.reason]
    notes += [f"  {o.engine}[{o.config}]: {o.stopped}" for o in outcomes if o.stopped]
    notes += [f"  {o.engine}[{o.config}]: note: {flag}" for o in outcomes for flag in o.flags]
    tail = ["", "why:", *notes] if notes else []
    return "\n".join(["", *lines, *tail, ""]) + "\n"


def best_vs_best(best: dict[str, Outcome], repeat: int, precision: float, outcomes: list[Outcome]) -> str:
    """Each engine's best configuration, ranked, with the margin of the winner, and a summary sentence
    per engine against its baseline (first) configuration, so one engine gets its answer too."""
    if not best:
        return "no configuration met the SLO at any rate tried\n"
    ranked = sorted(best.values(), key=lambda o: o.best_rate or 0.0, reverse=True)
    lines = ["", "best configuration per engine:"]
    for o in ranked:
        lines.append(f"  {o.engine}: {o.config} -> {o.best_rate:.3g} req/s under the SLO ({_bracket(o)})")
    lines += [f"summary: {_summary(o, outcomes)}" for o in ranked]
    if len(ranked) > 1:
        first, second = ranked[0], ranked[1]
        ratio = (first.best_rate or 0.0) / (second.best_rate or math.nan)
        lines.append(
            f"verdict: {first.engine} sustains {ratio:.2f}x {second.engine}'s rate under the SLO "
            f"({first.best_rate:.3g} vs {second.best_rate:.3g} req/s; each rate passed {repeat} run(s), "
            f"search precision {precision:.0%})"
        )
        if ratio < 1 + precision:
            lines.append("  within the search precision: no clear difference between the best configurations")
    return "\n".join(lines) + "\n"


def _summary(best: Outcome, outcomes: list[Outcome]) -> str:
    """'the best sim configuration is X: Y req/s under the SLO, Z x the baseline configuration'."""
    said = f"the best {best.engine} configuration is {best.config}: {best.best_rate:.3g} req/s under the SLO"
    baseline = next(o for o in outcomes if o.engine == best.engine)
    if baseline is best:
        return f"{said}, the baseline configuration itself"
    if not baseline.best_rate:
        return f"{said}; the baseline configuration ({baseline.config}) met it at no rate tried"
    ratio = (best.best_rate or 0.0) / baseline.best_rate
    return f"{said}, {ratio:.2f}x the baseline configuration ({baseline.config})"


def _last_line(log_tail: str) -> str:
    lines = [line for line in log_tail.splitlines() if line.strip()]
    return f"; its log ends: {lines[-1].strip()}" if lines else ""


def _status(o: Outcome) -> str:
    if o.status != "measured":
        return o.status
    if o.best_speed is None:
        return "below best" if o.stopped else "never met the SLO"
    return "measured"


def _rate(o: Outcome, facts: TraceFacts) -> str:
    if o.best_rate is None:
        return "-"
    if o.failed_speed is None:
        return f">= {o.best_rate:.3g} (no failure found)"
    return f"{o.best_rate:.3g} (fails at {o.failed_speed * facts.rate:.3g})"


def _bracket(o: Outcome) -> str:
    return f"passed at {o.best_speed:g}x" + (f", failed at {o.failed_speed:g}x" if o.failed_speed else "")


def _number(value: float | None, pattern: str = "{:.4g}") -> str:
    return "-" if value is None or not math.isfinite(value) else pattern.format(value)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
