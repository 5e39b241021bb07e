"""The report document's sections as tables: one function per section, shared by text, Markdown and HTML.

To add a section (e.g. engine telemetry), write `def section(doc) -> list[Table]` and append it to
SECTIONS; every renderer picks it up.
"""

from __future__ import annotations

from collections.abc import Callable

from replayproxy.report.cells import MISSING, Table, fmt, pct
from replayproxy.report.compare import QUANTILES
from replayproxy.report.decision_types import IntervalDoc
from replayproxy.report.document_types import (
    Breakdowns,
    DepthRow,
    Document,
    GoodputDoc,
    GroupDoc,
    PrefixCacheDoc,
    Quantiles,
    RunDoc,
    SessionsDoc,
    SloSection,
    SummaryDoc,
    stat,
    summary_of,
)
from replayproxy.report.engine_tables import contract_section, gpu_section, telemetry_section
from replayproxy.report.stats import STAT_NAMES

MAX_TEXT_WINDOWS = 30

LATENCY_ROWS = (
    ("TTFT ms", "ttft_ms"),
    ("TPOT ms (streaming, >=2 tokens)", "tpot_ms"),
    ("ITL ms", "itl_ms"),
    ("E2E ms", "e2e_ms"),
    ("schedule lag ms", "schedule_lag_ms"),
    ("TTFT from schedule ms", "ttft_from_scheduled_ms"),
    ("E2E from schedule ms", "e2e_from_scheduled_ms"),
)


def verdict_section(doc: Document) -> list[Table]:
    """The report's first lines: which candidate, by how much, how sure, and what weakens it."""
    return [Table("Verdict", [], [], list(doc["verdict"]["lines"]), "verdict")]


def fidelity_section(doc: Document) -> list[Table]:
    """Replays of production's own trace: how faithful they were, right after the verdict."""
    tables = []
    for f in doc["fidelity"]:
        rows = [
            [
                f"{g['figure']} p{g['quantile']} ms",
                fmt(g["production_ms"]),
                fmt(g["replay_ms"]),
                _signed(g["difference"]),
                f"[{_signed(g['low'])}, {_signed(g['high'])}]",
                "yes" if g["within_noise"] else "no",
            ]
            for g in f["figures"]
        ]
        notes = [*f["statement"], "known differences:"]
        notes += [
            f"  {d['name']}: {d['size']}" + (f" ({d['effect']})" if d["effect"] else "")
            for d in f["differences"]
        ]
        header = [
            "figure",
            "production",
            f"replay ({f['runs']} run{'s' if f['runs'] > 1 else ''})",
            "difference",
            "95% interval",
            "within noise",
        ]
        tables.append(Table(f"Fidelity: {f['candidate']} vs production", header, rows, notes, "fidelity"))
    return tables


def _signed(value: float | None) -> str:
    return MISSING if value is None else f"{value:+.1%}"


def latency_section(doc: Document) -> list[Table]:
    runs = doc["runs"]
    rows = []
    for title, key in LATENCY_ROWS:
        if key == "itl_ms":
            units = {r["itl_unit"] for r in runs if r["itl_ms"]["count"]}
            title = f"ITL ms (per {'/'.join(sorted(units))})" if units else title
        for i, name in enumerate(STAT_NAMES):
            rows.append([title if i == 0 else "", name, *(fmt(stat(summary_of(r, key), name)) for r in runs)])
    notes = [
        "latency covers successful requests; count = requests (ITL: gaps) measured; "
        "TPOT only over streaming replies of at least 2 output tokens"
    ]
    notes += [f"{r['name']}: {NO_TIMINGS}" for r in runs if r["succeeded"] and not r["timed_requests"]]
    return [Table("Latency", ["metric", "stat", *(r["name"] for r in runs)], rows, notes, "latency", keys=2)]


NO_TIMINGS = (
    f"no request has timings (e.g. a synthetic trace): its latency, goodput and concurrency are {MISSING}"
)


def throughput_section(doc: Document) -> list[Table]:
    runs = doc["runs"]

    def row(name: str, get: Callable[[RunDoc], str]) -> list[str]:
        return [name, *(get(r) for r in runs)]

    rows = [
        row("requests", lambda r: fmt(r["requests"])),
        row("succeeded", lambda r: fmt(r["succeeded"])),
        row("duration s", lambda r: fmt(r["duration_s"])),
        row("offered req/s", lambda r: fmt(r["offered_requests_per_s"])),
        row("achieved req/s", lambda r: fmt(r["requests_per_s"])),
        row("output tok/s", lambda r: fmt(r["output_tokens_per_s"])),
        row("input tok/s", lambda r: fmt(r["input_tokens_per_s"])),
        row("timed requests", lambda r: fmt(r["timed_requests"])),
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
    return [Table("Throughput and load", ["", *(r["name"] for r in runs)], rows, [], "throughput")]


def errors_section(doc: Document) -> list[Table]:
    runs = doc["runs"]
    classes = sorted({c for r in runs for c in r["errors"]["by_class"]})
    rows = [["error rate", *(f"{pct(r['errors']['rate'])} ({r['errors']['count']})" for r in runs)]]
    rows += [[c, *(fmt(r["errors"]["by_class"].get(c, 0)) for r in runs)] for c in classes]
    return [Table("Errors", ["", *(r["name"] for r in runs)], rows, [], "errors")]


def goodput_section(doc: Document) -> list[Table]:
    slo = doc["slo"]
    if slo is None:
        return []
    runs = doc["runs"]

    def meeting(g: GoodputDoc | None) -> str:
        return MISSING if g is None else f"{pct(g['fraction'])} ({g['good']}/{g['of']})"

    rows = [
        [
            "goodput req/s",
            *(fmt(None if r["goodput"] is None else r["goodput"]["requests_per_s"]) for r in runs),
        ],
        ["meeting all SLOs", *(meeting(r["goodput"]) for r in runs)],
    ]
    if any(c["metric"] == "makespan" and c["percentile"] is None for c in slo["clauses"]):
        sessions = [None if r["goodput"] is None else r["goodput"]["sessions"] for r in runs]
        rows += [
            ["goodput sessions/s", *(fmt(None if s is None else s["sessions_per_s"]) for s in sessions)],
            [
                "sessions meeting all SLOs",
                *(
                    MISSING if s is None else f"{pct(s['fraction'])} ({s['good']}/{s['of']})"
                    for s in sessions
                ),
            ],
        ]
    for i, clause in enumerate(c for c in slo["clauses"] if c["percentile"] is not None):
        cells = []
        for r in runs:
            check = None if r["goodput"] is None else r["goodput"]["percentile_checks"][i]
            cells.append(
                MISSING if check is None else f"{fmt(check['value_ms'])} {'ok' if check['met'] else 'MISSED'}"
            )
        rows.append([clause["text"], *cells])
    notes = [f"{r['name']}: {NO_TIMINGS}" for r in runs if r["goodput"] is None]
    skipped = [
        f"{r['name']}: {r['goodput']['not_applicable']} non-streaming or one-token replies have no TPOT/ITL; "
        "those clauses do not apply to them"
        for r in runs
        if r["goodput"] is not None and r["goodput"]["not_applicable"] and _per_token_clause(slo)
    ]
    return [
        Table(
            f"Goodput ({slo['spec']})",
            ["", *(r["name"] for r in runs)],
            rows,
            notes + skipped,
            "goodput",
        )
    ]


def _per_token_clause(slo: SloSection) -> bool:
    return any(c["metric"] in ("tpot", "itl") and c["percentile"] is None for c in slo["clauses"])


def comparison_section(doc: Document) -> list[Table]:
    """One table per compared pair: a row per metric and percentile, so it fits a terminal."""
    tables = []
    for c in doc["comparisons"]:
        rows = []
        for metric, mc in c.metrics.items():
            for i, q in enumerate(QUANTILES):
                head = [metric.upper(), fmt(mc.pairs), fmt(mc.median_ratio_b_over_a), pct(mc.share_faster_b)]
                quantile = mc.quantiles[q]
                rows.append(
                    [
                        *(head if i == 0 else [""] * len(head)),
                        f"p{q}",
                        _ci(quantile.diff_ms),
                        quantile.verdict,
                    ]
                )
        notes = [
            f"A = {c.a} ({_runs(c.runs_a)}), B = {c.b} ({_runs(c.runs_b)}); pairs: of the "
            f"{c.common_requests} requests in both first runs ({c.only_a} only in A, {c.only_b} only in B), "
            "those both answered and measured the metric",
            "diff: B - A of the mean per-run percentile, 95% CI from resampling runs, then requests; a "
            "difference within the spread between repetitions is 'no clear difference'",
        ]
        unpaired = [metric.upper() for metric, mc in c.metrics.items() if not mc.pairs]
        if unpaired and c.common_requests:
            notes.append(
                f"{', '.join(unpaired)}: no pair: none of the {c.common_requests} requests in both first "
                "runs was measured by both (failed, or no timings)"
            )
        if c.run_to_run_noise == "unknown":
            notes.append("run-to-run noise unknown (one run of A or B): replay with --repeat 3")
        header = ["metric", "pairs", "median B/A", "faster on B", "stat", "diff ms [95% CI]", "verdict"]
        tables.append(Table(f"Paired: {c.b} vs {c.a}", header, rows, notes, "comparison"))
    return tables


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def _ci(d: IntervalDoc) -> str:
    return f"{fmt(d['estimate'])} [{fmt(d['ci95_low'])}, {fmt(d['ci95_high'])}]"


GROUP_HEADER = ["requests", "errors", "TTFT p50", "TTFT p95", "TPOT p50", "E2E p50", "E2E p95"]


def _group_cells(g: GroupDoc) -> list[str]:
    return [
        fmt(g["requests"]),
        fmt(g["errors"]),
        fmt(g["ttft_ms"]["p50"]),
        fmt(g["ttft_ms"]["p95"]),
        fmt(g["tpot_ms"]["p50"]),
        fmt(g["e2e_ms"]["p50"]),
        fmt(g["e2e_ms"]["p95"]),
    ]


def _groups(breakdowns: Breakdowns, key: str) -> list[GroupDoc]:
    return breakdowns["input_length"] if key == "input_length" else breakdowns["endpoint"]


def breakdown_section(doc: Document) -> list[Table]:
    runs = doc["runs"]
    tables = []
    for key, title in (("input_length", "By input length (tokens)"), ("endpoint", "By endpoint")):
        rows = [[g["name"], r["name"], *_group_cells(g)] for r in runs for g in _groups(r["breakdowns"], key)]
        header = ["group", "run", *GROUP_HEADER]
        tables.append(Table(title, header, rows, ["latency in ms"], f"by_{key}", keys=2))
    windows = sum(len(r["breakdowns"]["window_10s"]) for r in runs)
    if windows <= MAX_TEXT_WINDOWS:
        rows = [
            [g["name"], r["name"], fmt(g["arrival_rate_per_s"]), *_group_cells(g)]
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
                keys=2,
            )
        )
    else:
        tables.append(
            Table("Per 10 s window", [], [], [f"{windows} windows: see --json or --html"], "by_window")
        )
    return tables


def sweep_section(doc: Document) -> list[Table]:
    """The operating line: one row per load step, offered against achieved, latency, errors, goodput."""
    tables = []
    for sweep in doc["sweeps"]:
        rows = []
        for s in sweep["steps"]:
            g = s["goodput"]
            load = f"c={s['concurrency_limit']}" if s["concurrency_limit"] else f"{s['speed']:g}x"
            rows.append(
                [
                    load,
                    fmt(s["offered_requests_per_s"]),
                    fmt(s["requests_per_s"]),
                    fmt(s["output_tokens_per_s"]),
                    fmt(s["mean_concurrency"]),
                    *(fmt(d[q]) for d in (s["ttft_ms"], s["tpot_ms"], s["e2e_ms"]) for q in ("p50", "p95")),
                    f"{pct(s['error_rate'])} ({s['errors']})",
                    MISSING if g is None else f"{fmt(g['requests_per_s'])} ({pct(g['fraction'])})",
                ]
            )
        header = [
            "load",
            "offered req/s",
            "achieved req/s",
            "out tok/s",
            "in flight",
            "TTFT p50",
            "TTFT p95",
            "TPOT p50",
            "TPOT p95",
            "E2E p50",
            "E2E p95",
            "errors",
            "goodput req/s",
        ]
        notes = [sweep["knee"], *sweep["noise"], "in flight = mean requests in flight; latency in ms"]
        if sweep["closed_loop"]:
            notes.append(f"closed loop: c=N keeps N requests in flight; offered rate is {MISSING}")
        if sweep["max_rate_under_slo"] is not None:
            notes.append(f"highest achieved rate meeting the SLO: {sweep['max_rate_under_slo']:.3g} req/s")
        if sweep["best_speed_meeting_slo"] is not None:
            notes.append(f"highest speed meeting the SLO: {sweep['best_speed_meeting_slo']:g}x")
        where = " ".join(p for p in (sweep["target"], sweep["model"]) if p and p not in sweep["label"])
        title = f"Sweep: {sweep['label']}" + (f" ({where})" if where else "")
        tables.append(Table(title, header, rows, notes, "sweep"))
    return tables


SESSION_ROWS: tuple[tuple[str, Callable[[SessionsDoc], SummaryDoc | None], tuple[str, ...]], ...] = (
    ("turns per session", lambda f: f["turns_per_session"], ("p50", "p95", "max")),
    ("makespan s (first send to last end)", lambda f: f["session_s"], ("p50", "p95", "max")),
    ("finish s (from first scheduled send)", lambda f: f["finish_from_schedule_s"], ("p50", "p95")),
    ("think ms as replayed", lambda f: f["think_ms"], ("p50", "p99")),
    ("think error ms (replayed - planned)", lambda f: f["think_error_ms"], ("p50", "p99")),
    ("think |error| ms", lambda f: f["think_abs_error_ms"], ("p50", "p99")),
)


def sessions_section(doc: Document) -> list[Table]:
    """Per-session figures beside the per-request ones, for runs of traces with multi-turn sessions."""
    pairs = [(r, sessions) for r in doc["runs"] if (sessions := r["sessions"])]
    if not pairs:
        return []
    runs, figures = [r for r, _ in pairs], [f for _, f in pairs]
    rows = [
        ["sessions (multi-turn)", *(f"{f['sessions']} ({f['multi_turn_sessions']})" for f in figures)],
        ["later turns", *(fmt(f["later_turns"]) for f in figures)],
        ["overlapping turns", *(fmt(f["overlapping_turns"]) for f in figures)],
    ]
    for title, summary, names in SESSION_ROWS:
        for name in names:
            rows.append([f"{title} {name}", *(fmt(_stat_or_none(summary(f), name)) for f in figures)])
    notes = [
        "overlapping: a turn sent before the previous turn of its session ended (production never did)",
        "planned think time: as recorded (closed loop) at the run's speed; the baseline is the trace itself",
    ]
    return [Table("Sessions", ["figure", *(r["label"] for r in runs)], rows, notes, "sessions")]


DEPTH_METRICS: tuple[tuple[str, Callable[[DepthRow], Quantiles]], ...] = (
    ("TTFT ms", lambda row: row["ttft_ms"]),
    ("E2E ms", lambda row: row["e2e_ms"]),
)


def _quantiles(q: Quantiles) -> str:
    return f"{fmt(q['p50'])} / {fmt(q['p95'])}"


def depth_section(doc: Document) -> list[Table]:
    """Per-step latency by depth in the session graph, candidates side by side: p50 / p95 per cell."""
    pairs = [(r, rows) for r in doc["runs"] if r["sessions"] and (rows := r["sessions"]["by_depth"])]
    if not pairs:
        return []
    runs = [r for r, _ in pairs]
    by_run = [{row["depth"]: row for row in rows} for _, rows in pairs]
    depths = sorted({d for rows in by_run for d in rows}, key=lambda d: int(d.split("-")[0].rstrip("+")))
    table = []
    for depth in depths:
        table.append(
            [f"depth {depth}: requests", *(fmt(r[depth]["requests"] if depth in r else None) for r in by_run)]
        )
        for name, get in DEPTH_METRICS:
            cells = [_quantiles(get(r[depth])) if depth in r else MISSING for r in by_run]
            table.append([f"depth {depth}: {name} p50 / p95", *cells])
    notes = ["depth: the request's turn, its longest path from a root of its session (0 = a root)"]
    return [Table("Latency by depth", ["figure", *(r["label"] for r in runs)], table, notes, "depth")]


def cached_share_section(doc: Document) -> list[Table]:
    """Cached-token share per call (cached / prompt tokens), beside the recorded share of each call."""
    pairs = [(r, share) for r in doc["runs"] if (share := r["cached_share"])]
    if not pairs:
        return []
    runs, shares = [r for r, _ in pairs], [c for _, c in pairs]
    rows = [
        ["calls reporting cached tokens", *(fmt(c["per_call"]["count"]) for c in shares)],
        *(
            [f"cached share per call {q}", *(pct(c["per_call"][q]) for c in shares)]
            for q in ("p50", "p95", "mean")
        ),
    ]
    if any(c["recorded"] for c in shares):
        rows += [
            [
                "paired calls (recorded share known)",
                *(fmt(_stat_or_none(c["recorded"], "count")) for c in shares),
            ],
            [
                "recorded share, same calls, mean",
                *(pct(_stat_or_none(c["recorded"], "mean")) for c in shares),
            ],
            *(
                [f"share - recorded, per call {q}", *(fmt(_stat_or_none(c["difference"], q)) for c in shares)]
                for q in ("p50", "p95", "mean")
            ),
        ]
    notes = [
        "share: cached tokens the reply reported / its prompt tokens; recorded: the baseline trace's call"
    ]
    return [
        Table("Cached tokens per call", ["figure", *(r["label"] for r in runs)], rows, notes, "cached_share")
    ]


def _stat_or_none(summary: SummaryDoc | None, name: str) -> float | int | None:
    return None if summary is None else stat(summary, name)


CACHE_ROWS: tuple[tuple[str, Callable[[PrefixCacheDoc], int | None]], ...] = (
    ("engine KV block size, tokens", lambda c: c["engine_block_size"]),
    ("prefix-cache hits the trace implies, tokens", lambda c: c["implied_hit_tokens"]),
    ("prefix-cache hits the engine reported, tokens", lambda c: c["engine_hit_tokens"]),
    ("cached tokens the replies reported, tokens", lambda c: c["reply_cached_tokens"]),
    ("replies that reported cached tokens", lambda c: c["replies_reporting_cached"]),
)


def prefix_cache_section(doc: Document) -> list[Table]:
    """The trace's sharing at the engine's block size beside the engine's own hit counter."""
    pairs = [(r, cache) for r in doc["runs"] if (cache := r["prefix_cache"])]
    if not pairs:
        return []
    runs, caches = [r for r, _ in pairs], [c for _, c in pairs]
    rows = [[title, *(fmt(get(c)) for c in caches)] for title, get in CACHE_ROWS]
    rows.append(["engine / implied", *(pct(c["engine_over_implied"]) for c in caches)])
    notes = [
        "implied: each request's prefix shared with an earlier request of the trace (with live replies, "
        "a later turn's also the previous turn's reply), in whole engine blocks (the last prompt token "
        "is always computed); engine: its prefix-cache hit counter over the run",
    ]
    return [Table("Prefix cache", ["figure", *(r["label"] for r in runs)], rows, notes, "prefix_cache")]


def shards_section(doc: Document) -> list[Table]:
    """Per shard of a sharded run: its schedule lag (on its own clock) beside its clock's offset
    (which lag cannot show: a shard whose clock is ahead starts early by as much)."""
    tables = []
    for run in doc["runs"]:
        if not run["shard_clocks"]:
            continue
        rows = [
            [
                c["shard"] or MISSING,
                fmt(c["lag_p99_ms"]),
                MISSING
                if c["clock_offset_ms"] is None
                else f"{fmt(c['clock_offset_ms'])} ± {fmt(c['clock_offset_bound_ms'])}",
                fmt(c["ready_before_start_s"]),
                fmt(c["wall_drift_ms"]),
            ]
            for c in run["shard_clocks"]
        ]
        sources = sorted({c["clock_reference"] for c in run["shard_clocks"] if c["clock_reference"]})
        notes = [
            f"clock offset: the shard's wall clock minus {' / '.join(sources) or 'a reference'} "
            "(one-second resolution, bounded by timed probes): positive means it started that much early",
            "ready: how long before the start everything was ready; wall drift: the start as the wall "
            "clock read after the run minus --start-at (the clock slewed or stepped meanwhile)",
        ]
        header = ["shard", "lag p99 ms", "clock offset ms", "ready before start s", "wall drift ms"]
        tables.append(
            Table(f"Shards of {run['name']}: schedule lag and clock", header, rows, notes, "shards")
        )
    return tables


def warnings_section(doc: Document) -> list[Table]:
    if not doc["warnings"]:
        return []
    return [Table("Warnings", [], [], list(doc["warnings"]), "warnings")]


SECTIONS: list[Callable[[Document], list[Table]]] = [
    verdict_section,
    fidelity_section,
    contract_section,
    latency_section,
    throughput_section,
    errors_section,
    goodput_section,
    comparison_section,
    breakdown_section,
    sweep_section,
    telemetry_section,
    prefix_cache_section,
    cached_share_section,
    gpu_section,
    sessions_section,
    depth_section,
    shards_section,
    warnings_section,
]


def report_tables(doc: Document) -> list[Table]:
    """Every section's tables, in SECTIONS order."""
    return [t for section in SECTIONS for t in section(doc)]
