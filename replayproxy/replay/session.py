"""One replay run end to end: load, ask the target, calibrate, prepare, run, write the result file.

Everything slow happens before the clock starts; the send loop (runner) only sees prepared bytes
and warm connections. With `workers > 1` the prepared requests are dealt to worker processes
(replay.workers) that share one absolute start time, and their results are merged here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import numpy as np

from replayproxy import __version__, clock, trace
from replayproxy.config import check_finite
from replayproxy.errors import BadOption
from replayproxy.replay import (
    calibrate,
    exact,
    exactness,
    flavors,
    models,
    plan,
    replies,
    schedule,
    summary,
    synth,
    turns,
)
from replayproxy.replay.connection import Pool, Target
from replayproxy.replay.plan import Prepared
from replayproxy.replay.progress import MODES, Reading
from replayproxy.replay.runner import Runner, restore_memory, settle_memory
from replayproxy.replay.target import TargetInfo, describe
from replayproxy.results import ReplayResult, ResultWriter, RunHeader
from replayproxy.tasks import spawn
from replayproxy.trace.reuse import prefix_reuse

_log = logging.getLogger("replayproxy.replay")
START_LEAD_NS = 200_000_000  # first send this long after everything is ready
MAX_POOL = 4096


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """`replayproxy replay` settings ([replay] in the config file, REPLAYPROXY_REPLAY_* variables)."""

    target: str = ""
    output: str = ""
    traces: tuple[str, ...] = ()
    speed: float = 1.0
    request_rate: float = 0.0  # req/s on average: sets the speed from the replayed window; 0 off
    max_concurrency: int = 0  # 0: open loop, no cap
    flavor: str = "auto"
    model: str = ""
    model_map: dict[str, str] = field(default_factory=dict)
    limit: int | None = None
    start_offset: float = 0.0  # seconds into the trace
    duration: float | None = None  # seconds of trace to replay
    seed: int = 0
    timeout: float = 600.0  # per request, seconds
    label: str = ""
    quiet: bool = False  # no progress display at all (as progress = "none")
    progress: str = "auto"  # auto | tty (live panel) | log (a line every 10 s) | none
    workers: int = 1
    shard: str = ""  # "i/N": only requests with index % N == i
    start_at: str = ""  # UTC ISO time or unix seconds: a start shared by several replayers
    reset_prefix_cache: bool = True
    calibrate: bool = True
    tokenizer: str = ""  # local tokenizer.json (or its directory) for exact prompts; "" = the engine's
    chat_template: str = ""  # Jinja chat template file for the local tokenizer ("" = its own)
    include_failed: bool = False  # replay requests that failed when recorded (left out by default)
    max_error_rate: float = 0.5  # above this share of failed requests the run exits 1
    api_key: str = ""  # sent as a bearer token; never recorded
    pool_size: int = 0  # connections opened before the run; 0: the trace's peak concurrency
    scrape_metrics: str = ""  # Prometheus URL polled during the run ("/metrics": the target's); "" off
    scrape_interval: float = 0.25  # seconds
    gpu_sampler: str = ""  # command whose CSV lines are stored with their arrival times
    warmup: str = ""  # "N" requests or "Ss" seconds of the trace sent first, not measured
    repeat: int = 1  # measured runs, each after the flavor's cache reset
    engine_args: str = ""  # how the engine was started, as the user tells it (the contract)
    note: str = ""  # free text kept with the run
    sessions: str = "auto"  # turns.MODES: closed loop within sessions, open loop, or closed if multi-turn
    sample_sessions: float | None = None  # keep this fraction of whole sessions (seeded)
    replies: str = "live"  # replies.MODES: a later turn carries the candidate's reply, or the planned one

    def __post_init__(self) -> None:
        check_finite(self)
        if self.speed <= 0:
            raise BadOption(f"speed must be > 0, got {self.speed}")
        if self.request_rate < 0:
            raise BadOption(f"request rate must be > 0, got {self.request_rate}")
        if not 0 <= self.max_error_rate <= 1:
            raise BadOption(f"max error rate must be between 0 and 1, got {self.max_error_rate}")
        if self.workers < 1 or self.max_concurrency < 0 or self.timeout <= 0:
            raise BadOption("workers must be >= 1, max_concurrency >= 0 and timeout > 0")
        if self.limit is not None and self.limit < 0:
            raise BadOption(f"limit must be >= 0, got {self.limit}")
        if self.shard:
            schedule.parse_shard(self.shard)
        if self.progress not in MODES:
            raise BadOption(f"progress must be one of {', '.join(MODES)}, got {self.progress!r}")
        if self.scrape_interval <= 0:
            raise BadOption(f"scrape interval must be > 0, got {self.scrape_interval}")
        if self.repeat < 1:
            raise BadOption(f"repeat must be >= 1, got {self.repeat}")
        if self.sessions not in turns.MODES:
            raise BadOption(f"sessions must be one of {', '.join(turns.MODES)}, got {self.sessions!r}")
        if self.replies not in replies.MODES:
            raise BadOption(f"replies must be one of {', '.join(replies.MODES)}, got {self.replies!r}")
        if self.sample_sessions is not None and not 0 < self.sample_sessions <= 1:
            raise BadOption(f"sample-sessions must be in (0, 1], got {self.sample_sessions}")

    def recorded(self) -> dict[str, Any]:
        """The options as stored in the result header: everything but secrets."""
        values = asdict(self)
        values.pop("api_key")
        values["traces"] = list(self.traces)
        return values

    @property
    def metrics_url(self) -> str:
        if self.scrape_metrics.startswith("/"):
            return Target.parse(self.target).url + self.scrape_metrics
        return self.scrape_metrics

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def parse_start_at(text: str) -> int:
    """`--start-at` as UTC nanoseconds: unix seconds, or an ISO time (naive means UTC)."""
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise BadOption(f"--start-at must be unix seconds or an ISO 8601 time, got {text!r}") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)


def trace_digest(paths: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for path in trace.expand_paths(paths):
        digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass(slots=True)
class RunPlan:
    """What the preparation produced, for the local runner or the workers."""

    prepared: list[Prepared]
    flavor: flavors.Flavor
    info: TargetInfo
    pre_run: dict[str, Any]
    pool_size: int
    trace_profile: dict[str, Any] = field(default_factory=dict)  # of the replayed window
    speed: float = 1.0  # the time scale used: --speed, or the one --request-rate asked for
    repetition: int = 1  # which measured run is next (1..options.repeat)
    warmup: dict[str, Any] = field(default_factory=dict)  # what the warm-up sent
    contract: dict[str, Any] = field(default_factory=dict)  # the conditions of the measurement
    sessions: turns.Mode = "open"  # as resolved for this trace
    live: replies.Setup | None = None  # how later turns are built from replies; None: as planned

    @property
    def closed_loop(self) -> bool:
        return self.sessions == "closed"


async def prepare_run(options: ReplayOptions) -> RunPlan:
    """Everything before the clock: trace, target description, calibration, bodies.

    The flavor's pre-run actions (cache resets) are left to `procedure.reset_target`, right before
    each measured run, so that a warm-up or an earlier repetition does not leave the cache warm.
    """
    cols = trace.load(options.traces)
    for warning in cols.report.warnings:
        _log.warning("%s", warning)
    window = schedule.Window(options.start_offset, options.duration, options.limit)
    mode = turns.resolve(options.sessions, cols)
    rows = turns.select_rows(cols, window, mode, options.sample_sessions, options.seed)
    rows, failed_left_out = _without_failures(cols, rows, options.include_failed)
    speed = options.speed
    if options.request_rate:
        speed = speed_for_rate(cols.offset_ns[rows], options.request_rate)
    target = Target.parse(options.target)
    timeout = aiohttp.ClientTimeout(total=max(60.0, options.timeout))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        guess = flavors.get("openai" if options.flavor == "auto" else options.flavor)
        info = await describe(session, target.url, guess, options.headers)
        flavor = flavors.get(flavors.guess(info.models)) if options.flavor == "auto" else guess
        if flavor is not guess:
            info = await describe(session, target.url, flavor, options.headers)
        served = models.served_models(info.models)
        choice = models.choose({str(m) for m in cols.model[rows]}, options.model, options.model_map, served)
        if choice.note:
            _log.warning("%s", choice.note)
        plan_options = plan.PlanOptions(
            seed=options.seed,
            speed=speed,
            model=options.model or None,
            model_map=choice.model_map,
            default_model=info.default_model,
        )
        record: dict[str, Any] = {}
        model = _probe_model(cols, rows, plan_options)
        prober = calibrate.Prober(session, target.url, flavor, model, options.headers)
        tokenizer, why = await exactness.find_tokenizer(
            options.tokenizer, options.chat_template, flavor, session, target.url, model, options.headers
        )
        book: exact.Book | None = None
        exact_record: dict[str, Any] = {"tokenizer": None, "lengths": "approximate", "reason": why}
        if tokenizer is not None:
            book, exact_record = await exactness.measure(tokenizer, cols, rows)
        if len(rows) and np.any(cols.endpoint[rows] == "completions"):
            flavor, ids_record = await exactness.check_token_ids(prober, flavor, book)
            exact_record.update(ids_record)
            prober.flavor = flavor
        plan_options = replace(plan_options, book=book)
        if options.calibrate and (book is None or book.failed):
            plan_options, record = await _calibrate(prober, cols, rows, flavor, plan_options)
        prepared = plan.prepare(cols, rows, flavor, plan_options)
        if tokenizer is not None and book is not None:
            exact_record["check"] = await exactness.verify(tokenizer, prepared)
        live, exact_record["replies"] = _live_replies(options, mode, book, flavor, target, model)
        if live is not None:
            prepared = replies.expect_live_sharing(replies.ask_for_token_ids(prepared, flavor))
        if mode == "closed":
            prepared, followers = replies.link_edits(cols, prepared, speed, whole=live is not None)
            live = replace(live, followers=followers) if live is not None else None
        approximate = [p for p in prepared if p.endpoint == "chat" and not p.exact]
        if options.calibrate and approximate:
            record["check"] = await calibrate.verify(prober, approximate)
    if options.shard:
        index, count = schedule.parse_shard(options.shard)
        prepared = [p for p in prepared if (p.group if mode == "closed" else p.index) % count == index]
    peak = _peak(cols, prepared)
    size = options.pool_size or min(MAX_POOL, peak + max(2, peak // 10))
    if options.max_concurrency:
        size = min(size, options.max_concurrency)
    outcome = {
        "prompts": exact_record,
        "calibration": record,
        "probes": prober.probes,
        "peak_concurrency": peak,
        "recorded_failures_left_out": failed_left_out,
        "sessions": mode,
    }
    replayed = rows[plan.replayable(cols)[rows]] if len(rows) else rows
    profile = window_profile(cols, replayed)
    return RunPlan(prepared, flavor, info, outcome, max(1, size), profile, speed, sessions=mode, live=live)


def _live_replies(
    options: ReplayOptions,
    mode: turns.Mode,
    book: exact.Book | None,
    flavor: flavors.Flavor,
    target: Target,
    model: str,
) -> tuple[replies.Setup | None, str]:
    """Live replies in closed loop with an exact tokenizer (else each later turn as planned, and why)."""
    if mode != "closed":
        return None, "planned: open loop sends every turn at its recorded time"
    if options.replies != "live":
        return None, "planned: --replies planned"
    return replies.setup_for(
        book, options.tokenizer, options.chat_template, flavor, target.url, model, options.headers
    )


def speed_for_rate(offsets_ns: np.ndarray, rate: float) -> float:
    """The time scale that replays these arrivals at `rate` requests/s on average."""
    span_s = (int(offsets_ns.max()) - int(offsets_ns.min())) / 1e9 if len(offsets_ns) else 0.0
    if len(offsets_ns) < 2 or span_s <= 0:
        raise BadOption("--request-rate needs two requests at different times in the replayed window")
    return rate * span_s / (len(offsets_ns) - 1)


def cache_metrics_url(options: ReplayOptions) -> str:
    """Where the engine's prefix-cache counters are read before and after the run."""
    return options.metrics_url or Target.parse(options.target).url + "/metrics"


def _without_failures(cols: trace.Columns, rows: np.ndarray, include: bool) -> tuple[np.ndarray, int]:
    """Rows that did not fail when recorded (a client's own cancel is not a failure), unless `include`."""
    if include or not len(rows):
        return rows, 0
    errors = cols.error[rows]
    keep = (errors == "") | (errors == "client_cancel")
    return rows[keep], int((~keep).sum())


def window_profile(cols: trace.Columns, rows: np.ndarray) -> dict[str, Any]:
    """The replayed window's prefix reuse, by the definition `inspect` uses (trace.reuse)."""
    total = int(np.maximum(cols.input_tokens[rows], 0).sum()) if len(rows) else 0
    return {"requests": len(rows), "input_tokens": total, "prefix_reuse": prefix_reuse(cols, rows)}


def _probe_model(cols: trace.Columns, rows: np.ndarray, options: plan.PlanOptions) -> str:
    models = Counter(str(m) for m in cols.model[rows]) if len(rows) else Counter()
    return plan.model_for(models.most_common(1)[0][0] if models else "", options)


async def _calibrate(
    prober: calibrate.Prober,
    cols: trace.Columns,
    rows: np.ndarray,
    flavor: flavors.Flavor,
    options: plan.PlanOptions,
) -> tuple[plan.PlanOptions, dict[str, Any]]:
    record: dict[str, Any] = {}
    endpoints = cols.endpoint[rows]
    chat_rows = rows[endpoints == "chat"]
    if len(chat_rows):
        keys = Counter(
            (synth.chat_roles(str(cols.roles[r])), bool(cols.has_tools[r])) for r in chat_rows.tolist()
        )
        template, record["chat"] = await calibrate.chat_template(prober, keys)
        options = replace(options, chat_template=template)
    if not flavor.token_id_prompts and np.any(endpoints == "completions"):
        template, record["completions"] = await calibrate.text_template(prober)
        options = replace(options, text_template=template)
    return options, record


def _peak(cols: trace.Columns, prepared: Sequence[Prepared]) -> int:
    if not prepared:
        return 0
    rows = np.array([p.index for p in prepared], np.int64)
    starts = np.array([p.scheduled_ns for p in prepared], np.int64)
    durations = schedule.estimate_e2e_ns(cols.e2e_ns[rows], cols.output_tokens[rows])
    return schedule.peak_concurrency(starts, durations)


def start_ns_for(options: ReplayOptions) -> int:
    """The absolute monotonic start: `--start-at` converted through a wall/monotonic anchor, or soon."""
    anchor = clock.Anchor.take()
    if not options.start_at:
        return anchor.mono_ns + START_LEAD_NS
    start = anchor.mono_ns + (parse_start_at(options.start_at) - anchor.wall_ns)
    if start < anchor.mono_ns:
        raise BadOption(f"--start-at {options.start_at} is in the past")
    return start


def wires_for(options: ReplayOptions, prepared: Sequence[Prepared]) -> list[bytes]:
    target = Target.parse(options.target)
    headers = {"Accept": "text/event-stream", **options.headers}
    return [target.request_bytes("POST", p.path, p.body, headers) for p in prepared]


@dataclass(slots=True)
class Outcome:
    """What a run produced so far: complete after `run_local` returns, partial if it was interrupted."""

    results: list[ReplayResult] = field(default_factory=list)
    start_ns: int = 0  # absolute monotonic start; 0 until it was decided
    live_replies: dict[str, Any] = field(default_factory=dict)  # replies.Counts.record(), if live


async def run_local(
    options: ReplayOptions,
    prepared: Sequence[Prepared],
    pool_size: int,
    start: Callable[[], int] | int,
    *,
    worker: int = 0,
    progress: Callable[[Runner], None] | None = None,
    outcome: Outcome | None = None,
    closed_loop: bool = False,
    live: replies.Setup | None = None,
) -> Outcome:
    """Warm a pool, wait for the start, send; fills and returns `outcome` (results, absolute start).
    With `live` (closed loop), later turns are built from the replies to the turns before them."""
    outcome = outcome if outcome is not None else Outcome()
    target = Target.parse(options.target)
    pool = Pool(target, clock.now_ns, options.headers)
    wires = wires_for(options, prepared)
    async with contextlib.AsyncExitStack() as stack:
        threader = None
        if live is not None and closed_loop:
            opened = replies.opened(live, target, options.headers, prepared)
            threader = await stack.enter_async_context(opened)
        try:
            await pool.fill(pool_size)
            runner = Runner(
                prepared,
                wires,
                pool,
                clock=clock.now_ns,
                timeout_s=options.timeout,
                max_concurrency=options.max_concurrency,
                worker=worker,
                results=outcome.results,
                closed_loop=closed_loop,
                rebuild=threader.wire_after if threader is not None else None,
            )
            settle_memory()
            outcome.start_ns = start if isinstance(start, int) else start()
            reporter = spawn(_report_progress(runner, progress), name="replay-progress") if progress else None
            try:
                await runner.run(outcome.start_ns)
            finally:
                if reporter is not None:
                    reporter.cancel()
        finally:
            pool.close()
            restore_memory()
            if threader is not None:
                outcome.live_replies = threader.counts.record()
    return outcome


PROGRESS_ROOM_NS = 5_000_000  # draw progress when the next send is at least this far away...
PROGRESS_WAIT_S = 0.25  # ...or after waiting this long for such a gap


async def _report_progress(runner: Runner, progress: Callable[[Runner], None]) -> None:
    while True:
        await asyncio.sleep(1.0)
        for _ in range(int(PROGRESS_WAIT_S / 0.001)):
            if not 0 < runner.next_deadline_ns - clock.now_ns() < PROGRESS_ROOM_NS:
                break
            await asyncio.sleep(0.001)  # a send is due soon: drawing must not delay it
        progress(runner)


class RunnerReadings:
    """Progress readings of a local runner: its counts, and the lags and TTFTs new since the last."""

    def __init__(self) -> None:
        self._seen = 0

    def __call__(self, runner: Runner) -> Reading:
        c = runner.counters
        lags, c.lags_ns = c.lags_ns, []
        new, self._seen = runner.results[self._seen :], len(runner.results)
        ttfts = [r.ttft_ns for r in new if not r.error and r.ttft_ns >= 0]
        return Reading(c.total, c.sent, c.done, c.errors, lags, ttfts)


def header_for(options: ReplayOptions, run: RunPlan, start_wall_ns: int, token_timing: str) -> RunHeader:
    return RunHeader(
        label=options.label or f"{run.flavor.name}@{Target.parse(options.target).host_header}",
        target=options.target,
        start_wall_ns=start_wall_ns,
        trace_paths=tuple(str(p) for p in trace.expand_paths(options.traces)),
        trace_digest=trace_digest(options.traces),
        flavor=run.flavor.name,
        models=run.info.models,
        engine_version=run.info.engine_version,
        options={**options.recorded(), "speed": run.speed},
        pre_run=run.pre_run,
        replayproxy_version=__version__,
        host=socket.gethostname(),
        token_timing=token_timing,
        shard=options.shard,
        repetition=run.repetition,
        repetitions=options.repeat,
        warmup=run.warmup,
        contract=run.contract,
    )


def write_results(
    options: ReplayOptions,
    run: RunPlan,
    results: Sequence[ReplayResult],
    start_wall_ns: int,
    extras: dict[str, dict[str, Any]] | None = None,
    stopped_s: float | None = None,
) -> dict[str, Any]:
    """Write the .rpr (results in trace order) with the summary as footer; returns the summary.

    `stopped_s`: the run was interrupted that many seconds after its start; the footer says it is
    partial, so reports neither take it for a whole run nor count its cut-off requests as errors.
    """
    ordered = sorted(results, key=lambda r: r.index)
    token_timing = "token" if any(r.chunk_tokens for r in ordered) else "chunk"
    facts = summary.summarize(ordered, options.max_concurrency)
    facts["recorded_failures_left_out"] = run.pre_run.get("recorded_failures_left_out", 0)
    prompts = run.pre_run.get("prompts", {})
    facts["lengths"] = prompts.get("lengths", "approximate")
    facts["tokenizer"] = prompts.get("tokenizer")
    if stopped_s is not None:
        facts.update(partial=True, stopped_after_s=round(stopped_s, 3), planned_requests=len(run.prepared))
    writer = ResultWriter(options.output, header_for(options, run, start_wall_ns, token_timing))
    for result in ordered:
        writer.write(result)
    writer.write_extra("trace_profile", run.trace_profile)
    for kind, record in (extras or {}).items():
        writer.write_extra(kind, record)
    writer.close(summary=facts)
    return facts
