"""The report document as tables: one function per section, shared by text, Markdown and HTML.

To add a section (e.g. engine telemetry), write `def section(doc) -> list[Table]` and append it to
SECTIONS; every renderer picks it up.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replayproxy.report.stats import STAT_NAMES

MAX_TEXT_WINDOWS = 30


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    key: str = ""  # machine name of the section, e.g. for HTML anchors


def fmt(value: Any) -> str:
    """Numbers for humans: '-' for missing, integers plain, floats to about four significant digits."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        magnitude = abs(value)
        if magnitude >= 1000 or value == int(value) and magnitude >= 100:
            return f"{value:.0f}"
        if magnitude >= 100:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


LATENCY_ROWS = (
    ("TTFT ms", "ttft_ms"),
    ("TPOT ms", "tpot_ms"),
    ("ITL ms", "itl_ms"),
    ("E2E ms", "e2e_ms"),
    ("schedule lag ms", "schedule_lag_ms"),
    ("TTFT from schedule ms", "ttft_from_scheduled_ms"),
    ("E2E from schedule ms", "e2e_from_scheduled_ms"),
)


def latency_section(doc: dict[str, Any]) -> list[Table]:
    runs = doc["runs"]
    rows = []
    for title, key in LATENCY_ROWS:
        if key == "itl_ms":
            units = {r["itl_unit"] for r in runs if r["itl_ms"]["count"]}
            title = f"ITL ms (per {'/'.join(sorted(units))})" if units else title
        for i, stat in enumerate(STAT_NAMES):
            rows.append([title if i == 0 else "", stat, *(fmt(r[key][stat]) for r in runs)])
    notes = ["latency covers successful requests; count = requests (ITL: gaps) measured"]
    return [Table("Latency", ["metric", "stat", *(r["label"] for r in runs)], rows, notes, "latency")]


def throughput_section(doc: dict[str, Any]) -> list[Table]:
    runs = doc["runs"]

    def row(name: str, get: Callable[[dict[str, Any]], str]) -> list[str]:
        return [name, *(get(r) for r in runs)]

    rows = [
        row("requests", lambda r: fmt(r["requests"])),
        row("succeeded", lambda r: fmt(r["succeeded"])),
        row("duration s", lambda r: fmt(r["duration_s"])),
        row("offered req/s", lambda r: fmt(r["offered_requests_per_s"])),
        row("achieved req/s", lambda r: fmt(r["requests_per_s"])),
        row("output tok/s", lambda r: fmt(r["output_tokens_per_s"])),
        row("input tok/s", lambda r: fmt(r["input_tokens_per_s"])),
        row("concurrency mean", lambda r: fmt(r["concurrency"]["mean"])),
        row("concurrency peak", lambda r: fmt(r["concurrency"]["peak"])),
        row(
            "input tokens p50 / mean",
            lambda r: f"{fmt(r['input_tokens']['p50'])} / {fmt(r['input_tokens']['mean'])}",
        ),
        row(
            "output tokens p50 / mean",
            lambda r: f"{fmt(r['output_tokens']['p50'])} / {fmt(r['output_tokens']['mean'])}",
        ),
        row("output tokens from usage", lambda r: pct(r["output_tokens_from_usage_share"])),
        row("exact input length", lambda r: f"{pct(r['exact_input_share'])} of {r['exact_input_count']}"),
        row("exact output length", lambda r: f"{pct(r['exact_output_share'])} of {r['exact_output_count']}"),
    ]
    return [Table("Throughput and load", ["", *(r["label"] for r in runs)], rows, [], "throughput")]


def errors_section(doc: dict[str, Any]) -> list[Table]:
    runs = doc["runs"]
    classes = sorted({c for r in runs for c in r["errors"]["by_class"]})
    rows = [["error rate", *(f"{pct(r['errors']['rate'])} ({r['errors']['count']})" for r in runs)]]
    rows += [[c, *(fmt(r["errors"]["by_class"].get(c, 0)) for r in runs)] for c in classes]
    return [Table("Errors", ["", *(r["label"] for r in runs)], rows, [], "errors")]


def goodput_section(doc: dict[str, Any]) -> list[Table]:
    if doc["slo"] is None:
        return []
    runs = doc["runs"]
    rows = [
        ["goodput req/s", *(fmt(r["goodput"]["requests_per_s"]) for r in runs)],
        [
            "meeting all SLOs",
            *(f"{pct(r['goodput']['fraction'])} ({r['goodput']['good']}/{r['goodput']['of']})" for r in runs),
        ],
    ]
    for i, clause in enumerate(c for c in doc["slo"]["clauses"] if c["percentile"] is not None):
        cells = []
        for r in runs:
            check = r["goodput"]["percentile_checks"][i]
            cells.append(f"{fmt(check['value_ms'])} {'ok' if check['met'] else 'MISSED'}")
        rows.append([clause["text"], *cells])
    return [Table(f"Goodput ({doc['slo']['spec']})", ["", *(r["label"] for r in runs)], rows, [], "goodput")]


def comparison_section(doc: dict[str, Any]) -> list[Table]:
    tables = []
    for c in doc["comparisons"]:
        rows = []
        for metric in ("ttft", "e2e"):
            mc = c[metric]
            rows.append(
                [
                    metric.upper(),
                    fmt(mc["pairs"]),
                    fmt(mc["median_ratio_b_over_a"]),
                    pct(mc["share_faster_b"]),
                    _ci(mc["p50_diff_ms"]),
                    mc["p50_verdict"],
                    _ci(mc["p99_diff_ms"]),
                    mc["p99_verdict"],
                ]
            )
        notes = [
            f"A = {c['a']}, B = {c['b']}; {c['common_requests']} requests in both "
            f"({c['only_a']} only in A, {c['only_b']} only in B); diffs are B - A with bootstrap 95% CI"
        ]
        header = [
            "metric",
            "pairs",
            "median B/A",
            "faster on B",
            "p50 diff ms [95% CI]",
            "p50",
            "p99 diff ms [95% CI]",
            "p99",
        ]
        tables.append(Table(f"Paired: {c['b']} vs {c['a']}", header, rows, notes, "comparison"))
    return tables


def _ci(d: dict[str, Any]) -> str:
    return f"{fmt(d['estimate'])} [{fmt(d['ci95_low'])}, {fmt(d['ci95_high'])}]"


GROUP_HEADER = ["requests", "errors", "TTFT p50", "TTFT p95", "TPOT p50", "E2E p50", "E2E p95"]


def _group_cells(g: dict[str, Any]) -> list[str]:
    return [
        fmt(g["requests"]),
        fmt(g["errors"]),
        fmt(g["ttft_ms"]["p50"]),
        fmt(g["ttft_ms"]["p95"]),
        fmt(g["tpot_ms"]["p50"]),
        fmt(g["e2e_ms"]["p50"]),
        fmt(g["e2e_ms"]["p95"]),
    ]


def breakdown_section(doc: dict[str, Any]) -> list[Table]:
    runs = doc["runs"]
    tables = []
    for key, title in (("input_length", "By input length (tokens)"), ("endpoint", "By endpoint")):
        rows = [[g["name"], r["label"], *_group_cells(g)] for r in runs for g in r["breakdowns"][key]]
        tables.append(Table(title, ["group", "run", *GROUP_HEADER], rows, ["latency in ms"], f"by_{key}"))
    windows = sum(len(r["breakdowns"]["window_10s"]) for r in runs)
    if windows <= MAX_TEXT_WINDOWS:
        rows = [
            [g["name"], r["label"], fmt(g["arrival_rate_per_s"]), *_group_cells(g)]
            for r in runs
            for g in r["breakdowns"]["window_10s"]
        ]
        tables.append(
            Table(
                "Per 10 s window",
                ["from", "run", "arrivals/s", *GROUP_HEADER],
                rows,
                ["latency in ms"],
                "by_window",
            )
        )
    else:
        tables.append(
            Table("Per 10 s window", [], [], [f"{windows} windows: see --json or --html"], "by_window")
        )
    return tables


def sweep_section(doc: dict[str, Any]) -> list[Table]:
    tables = []
    for sweep in doc["sweeps"]:
        rows = []
        for s in sweep["steps"]:
            g = s["goodput"]
            rows.append(
                [
                    f"{s['speed']:g}x",
                    fmt(s["requests_per_s"]),
                    fmt(s["output_tokens_per_s"]),
                    fmt(s["mean_concurrency"]),
                    fmt(s["ttft_ms"]["p50"]),
                    fmt(s["ttft_ms"]["p95"]),
                    fmt(s["ttft_ms"]["p99"]),
                    fmt(s["tpot_ms"]["p50"]),
                    fmt(s["tpot_ms"]["p95"]),
                    f"{pct(s['error_rate'])} ({s['errors']})",
                    "-" if g is None else f"{fmt(g['requests_per_s'])} ({pct(g['fraction'])})",
                ]
            )
        header = [
            "speed",
            "req/s",
            "out tok/s",
            "in flight",
            "TTFT p50",
            "TTFT p95",
            "TTFT p99",
            "TPOT p50",
            "TPOT p95",
            "errors",
            "goodput req/s",
        ]
        notes = [sweep["knee"], "in flight = mean requests in flight; latency in ms"]
        if sweep["best_speed_meeting_slo"] is not None:
            notes.append(f"highest speed meeting the SLO: {sweep['best_speed_meeting_slo']:g}x")
        tables.append(
            Table(f"Sweep: {sweep['target']} {sweep['model']}".strip(), header, rows, notes, "sweep")
        )
    return tables


TELEMETRY_ROWS = (
    ("KV cache usage peak", "kv_usage_peak", pct),
    ("KV cache usage mean", "kv_usage_mean", pct),
    ("requests waiting, peak", "waiting_peak", fmt),
    ("time with requests waiting", "waiting_time_share", pct),
    ("requests running, peak", "running_peak", fmt),
    ("preemptions per 1k requests", "preemptions_per_1k_requests", fmt),
    ("engine prefix-cache hit rate", "prefix_hit_rate", pct),
)
ENGINE_LATENCY = (
    ("TTFT", "engine_ttft_ms", "ttft_ms"),
    ("ITL", "engine_itl_ms", "itl_ms"),
    ("E2E", "engine_e2e_ms", "e2e_ms"),
)


def telemetry_section(doc: dict[str, Any]) -> list[Table]:
    """Why a run was slow, in the engine's own words, beside the client's view of the same run."""
    runs = [r for r in doc["runs"] if r.get("telemetry")]
    if not runs:
        return []
    rows = [[title, *(get(r["telemetry"].get(key)) for r in runs)] for title, key, get in TELEMETRY_ROWS]
    rows.append(["trace prefix reuse", *(pct(r.get("trace_prefix_reuse")) for r in runs)])
    for name, engine_key, client_key in ENGINE_LATENCY:
        for stat in ("p50", "p90", "p99"):
            engine = [fmt((r["telemetry"].get(engine_key) or {}).get(stat)) for r in runs]
            rows.append(
                [
                    f"{name} {stat} ms: engine / client",
                    *(f"{e} / {fmt(r[client_key][stat])}" for e, r in zip(engine, runs, strict=True)),
                ]
            )
    notes = [
        "engine figures come from the target's /metrics, polled during the run; '-' = not exposed",
        "engine vs client latency: the difference is network, proxy and client time",
    ]
    return [Table("Engine telemetry", ["figure", *(r["label"] for r in runs)], rows, notes, "telemetry")]


CACHE_ROWS = (
    ("engine KV block size, tokens", "engine_block_size"),
    ("prefix-cache hits the trace implies, tokens", "implied_hit_tokens"),
    ("prefix-cache hits the engine reported, tokens", "engine_hit_tokens"),
)


def prefix_cache_section(doc: dict[str, Any]) -> list[Table]:
    """The trace's sharing at the engine's block size beside the engine's own hit counter."""
    runs = [r for r in doc["runs"] if r.get("prefix_cache")]
    if not runs:
        return []
    rows = [[title, *(fmt(r["prefix_cache"].get(key)) for r in runs)] for title, key in CACHE_ROWS]
    rows.append(["engine / implied", *(pct(r["prefix_cache"].get("engine_over_implied")) for r in runs)])
    notes = [
        "implied: each request's prefix shared with an earlier request of the trace, in whole engine blocks "
        "(the last prompt token is always computed); engine: its prefix-cache hit counter over the run",
    ]
    return [Table("Prefix cache", ["figure", *(r["label"] for r in runs)], rows, notes, "prefix_cache")]


def warnings_section(doc: dict[str, Any]) -> list[Table]:
    if not doc["warnings"]:
        return []
    return [Table("Warnings", [], [], list(doc["warnings"]), "warnings")]


SECTIONS: list[Callable[[dict[str, Any]], list[Table]]] = [
    latency_section,
    throughput_section,
    errors_section,
    goodput_section,
    comparison_section,
    breakdown_section,
    sweep_section,
    telemetry_section,
    prefix_cache_section,
    warnings_section,
]


def tables(doc: dict[str, Any]) -> list[Table]:
    return [t for section in SECTIONS for t in section(doc)]
