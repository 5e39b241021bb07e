"""Everything before the clock: load the trace, ask the target, measure prompts, plan the schedule.

The bodies themselves are not made here: the preparer process (replay.preparer), started first so
that it loads the trace while the target is described, plans them once and streams each sender
its share while the run goes. What is planned here is the schedule (a few numbers per request),
the prompt measurements every body depends on, and a check of the first requests' bodies, so
the first request goes out within seconds whatever the trace's length.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection as Pipe
from typing import Any, TypedDict

import numpy as np

from replayproxy import trace
from replayproxy.errors import BadInputFile, BadOption
from replayproxy.replay import (
    calibrate,
    clock_offset,
    flavors,
    models,
    plan,
    probe_http,
    prompt_parts,
    replies,
    schedule,
    shards,
    synth,
    tokenizer_setup,
    turns,
)
from replayproxy.replay.connection import Target
from replayproxy.replay.options import ReplayOptions
from replayproxy.replay.prepared import Schedule
from replayproxy.replay.preparer import Preparer
from replayproxy.replay.target import TargetInfo, describe
from replayproxy.results import ClockReference, RunContract, RunWarmup
from replayproxy.tasks import spawn
from replayproxy.trace import storage
from replayproxy.trace.reuse import prefix_reuse

_log = logging.getLogger("replayproxy.replay")
MAX_POOL = 4096
CHECKED_REQUESTS = 64  # the first requests of the schedule are prepared here too, to check their
CHECKED_TOKENS = tokenizer_setup.VERIFY_TOKENS  # lengths: this many, or fewer holding this many prompt tokens


@dataclass(frozen=True, slots=True)
class Share:
    """The requests one sender sends: their schedule and the pipe their bytes arrive on from the
    preparer."""

    feed: Pipe | None  # None: no requests
    schedule: Schedule


class TraceProfile(TypedDict):
    """The result file's `trace_profile` side record: what the replayed window held."""

    requests: int
    input_tokens: int
    prefix_reuse: float | None


@dataclass(slots=True)
class RunPlan:
    """What the preparation produced, for the local runner or the workers."""

    schedule: Schedule  # every planned request, in planning (arrival) order
    send: np.ndarray  # positions into `schedule` this replayer sends (its shard), ascending
    rows: np.ndarray  # the trace rows planned
    plan_options: plan.PlanOptions
    flavor: flavors.Flavor
    info: TargetInfo
    pre_run: dict[str, Any]
    pool_size: int
    trace_paths: tuple[str, ...] = ()
    trace_digest: str = ""  # sha256 of the trace files' bytes, as read
    trace_profile: TraceProfile = field(  # of the replayed window
        default_factory=lambda: TraceProfile(requests=0, input_tokens=0, prefix_reuse=None)
    )
    speed: float = 1.0  # the time scale used: --speed, or the one --request-rate asked for
    repetition: int = 1  # which measured run is next (1..options.repeat)
    warmup: RunWarmup = field(default_factory=RunWarmup)  # what the warm-up sent
    contract: RunContract = field(default_factory=RunContract)  # the conditions of the measurement
    sessions: turns.Mode = "open"  # as resolved for this trace
    live: replies.Setup | None = None  # how later turns are built from replies; None: as planned
    preparer: Preparer | None = None  # streams the bodies
    clock_reference: ClockReference | None = None  # with --start-at: the wall clock vs the target's
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the preparer, and the
    # local copies of a remote trace it reads: ended by `close`

    @property
    def closed_loop(self) -> bool:
        return self.sessions == "closed"

    @property
    def requests(self) -> int:
        return len(self.send)

    def share(self, options: ReplayOptions, positions: np.ndarray, shift_ns: int = 0) -> Share:
        """The requests at `positions` (into `schedule`), their schedule moved `shift_ns` earlier."""
        return self.shares(options, [positions], shift_ns)[0]

    def shares(self, options: ReplayOptions, dealt: Sequence[np.ndarray], shift_ns: int = 0) -> list[Share]:
        """One share per sender of the positions `dealt` to it; the preparer makes all of them in one
        pass over the plan (each request's bytes as the whole plan gives them)."""
        sending = [sender for sender, positions in enumerate(dealt) if len(positions)]
        feeds: list[Pipe | None] = [None] * len(dealt)
        if self.preparer is not None and sending:
            pipes = self.preparer.deal(
                self.schedule, [dealt[s] for s in sending], self.flavor, self.plan_options,
                options.target, options.headers,
            )  # fmt: skip
            for sender, pipe in zip(sending, pipes, strict=True):
                feeds[sender] = pipe
        out = []
        for positions, feed in zip(dealt, feeds, strict=True):
            part = self.schedule.take(positions)
            if shift_ns:
                part = part._replace(scheduled_ns=part.scheduled_ns - shift_ns)
            out.append(Share(feed, part))
        return out

    def deal(self, count: int) -> list[np.ndarray]:
        return deal(self.schedule, self.send, count, self.closed_loop)

    def close(self) -> None:
        """End the preparer process and remove the trace's local copies (after the last run)."""
        self.held.close()


def deal(planned: Schedule, send: np.ndarray, count: int, by_session: bool) -> list[np.ndarray]:
    """The positions `send` dealt to `count` senders round-robin in schedule order; by session (a
    worker waits only for turns it sent itself), sessions taken in the order of their first turns.
    A request the planner links to another session's turn (an edited reply) is moved to that turn's
    sender as it is planned (replay.preparer)."""
    if not by_session:
        return [send[worker::count] for worker in range(count)]
    groups = planned.group[send]
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    worker_of = rank[inverse.reshape(-1)] % count
    return [send[worker_of == worker] for worker in range(count)]


async def prepare_run(options: ReplayOptions) -> RunPlan:
    """Everything before the clock: trace, target description, calibration, the schedule; the
    returned plan holds the preparer process, which `RunPlan.close` ends.

    The flavor's pre-run actions (cache resets) are left to `procedure.reset_target`, right before
    each measured run, so that a warm-up or an earlier repetition does not leave the cache warm.
    A remote trace is downloaded once, here, to local copies that this process and the preparer
    both read.
    """
    with contextlib.ExitStack() as held:
        traces = held.enter_context(storage.local_copies(options.traces, trace.SUFFIX))
        preparer = Preparer([t if isinstance(t, storage.Spilled) else str(t) for t in traces])
        held.callback(preparer.close)  # before the copies are removed
        run_plan = await _prepare(options, traces)
        run_plan.preparer = preparer
        run_plan.held = held.pop_all()
    return run_plan


async def _prepare(options: ReplayOptions, traces: Sequence[storage.Source]) -> RunPlan:
    cols = trace.load(traces, digest=True)
    if not len(cols):  # what the read skipped is the reason: said in the one line
        losses = f" ({'; '.join(cols.report.warnings)})" if cols.report.warnings else ""
        raise BadInputFile(
            f"{', '.join(map(str, options.traces))}: the trace holds no requests to replay{losses}"
        )
    for warning in cols.report.warnings:
        _log.warning("%s", warning)
    window = schedule.TraceSlice(options.start_offset, options.duration, options.limit)
    mode = turns.resolve(options.sessions, cols)
    rows = turns.select_rows(cols, window, mode, options.sample_sessions, options.seed)
    rows, failed_left_out = _without_failures(cols, rows, options.include_failed)
    _refuse_nothing_to_send(rows, failed_left_out)
    speed = options.speed
    if options.request_rate:
        speed = speed_for_rate(cols.offset_ns[rows], options.request_rate)
    target = Target.parse(options.target)
    async with probe_http.session(max(60.0, options.timeout)) as session:
        offset = None  # a start shared with other replayers: how far this clock is from a common one
        if options.start_at:
            offset = spawn(clock_offset.against_date(session, target.url + "/v1/models", options.headers),
                           name="replay-clock-offset")  # fmt: skip
        guess = flavors.get("openai" if options.flavor == "auto" else options.flavor)
        info = await describe(session, target.url, guess, options.headers)
        flavor = flavors.get(flavors.guess(info.models)) if options.flavor == "auto" else guess
        if flavor is not guess:
            info = await describe(session, target.url, flavor, options.headers)
        served = models.served_models(info.models)
        requested = Counter(cols.model[rows].tolist())  # recorded model name -> requests
        choice = models.choose({str(m) for m in requested}, options.model, options.model_map, served)
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
        model = _probe_model(requested, plan_options)
        prober = calibrate.Prober(session, target.url, flavor, model, options.headers)
        chosen = await tokenizer_setup.choose_tokenizer(
            options.tokenizer, options.chat_template, flavor, session, target.url, model, options.headers,
            info.models,
        )  # fmt: skip
        tokenizer = chosen.tokenizer
        book: prompt_parts.Book | None = None
        exact_record: dict[str, Any] = {"tokenizer": None, "lengths": "approximate", "reason": chosen.note}
        if tokenizer is not None:
            book, exact_record = await tokenizer_setup.measure_book(tokenizer, cols, rows)
            exact_record["tokenizer_source"] = chosen.note
        if book is None:
            tokenizer_setup.require_exact(exact_record, options.allow_approximate)
        if len(rows) and np.any(cols.endpoint[rows] == "completions"):
            flavor, ids_record = await tokenizer_setup.check_token_ids(prober, flavor, book)
            exact_record.update(ids_record)
            prober.flavor = flavor
        plan_options = replace(plan_options, book=book)
        if options.calibrate and (book is None or book.failed):
            plan_options, record = await _calibrate(prober, cols, rows, flavor, plan_options)
        first = plan.prepare(cols, _checked(cols, rows), flavor, plan_options)  # as the preparer will
        if tokenizer is not None and book is not None:
            exact_record["check"] = await tokenizer_setup.verify(tokenizer, first)
        approximate = [p for p in first if p.endpoint == "chat" and not p.exact]
        if options.calibrate and approximate:
            record["check"] = await calibrate.verify(prober, approximate)
        live, exact_record["replies"] = _live_replies(options, mode, book, chosen.path, flavor, target, model)
        reference = await offset if offset is not None else None
    # closed loop: the planner rewrites each later turn from the turns before it (replay.continuations)
    plan_options = replace(plan_options, closed_loop=mode == "closed", live_replies=live is not None)
    planned = plan.schedule(cols, rows, speed)
    send = np.arange(len(planned.trace_index), dtype=np.int64)
    if options.shard:
        index, count = schedule.parse_shard(options.shard)
        send = send[shards.shard_of(cols, planned.trace_index, count) == index]  # sessions kept whole
    peak = _peak(cols, planned.take(send))
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
    profile = window_profile(cols, planned.trace_index)
    return RunPlan(
        planned, send, rows, plan_options, flavor, info, outcome, max(1, size),
        tuple(cols.report.paths), cols.report.content.hexdigest(), profile, speed, sessions=mode,
        live=live, clock_reference=reference,
    )  # fmt: skip


def _refuse_nothing_to_send(rows: np.ndarray, failed_left_out: int) -> None:
    """A run that would send nothing measures nothing: refused before the target is asked."""
    if len(rows):
        return
    if failed_left_out:
        raise BadInputFile(
            f"all {failed_left_out} requests to replay failed at the source (--include-failed sends them)"
        )
    raise BadOption("no request of the trace falls in the window asked (--start-offset, --duration, --limit)")


def speed_for_rate(offsets_ns: np.ndarray, rate: float) -> float:
    """The time scale that replays these arrivals at `rate` requests/s on average."""
    span_s = (int(offsets_ns.max()) - int(offsets_ns.min())) / 1e9 if len(offsets_ns) else 0.0
    if len(offsets_ns) < 2 or span_s <= 0:
        raise BadOption("--request-rate needs two requests at different times in the replayed window")
    return rate * span_s / (len(offsets_ns) - 1)


def _without_failures(cols: trace.Columns, rows: np.ndarray, include: bool) -> tuple[np.ndarray, int]:
    """Rows that did not fail when recorded (a client's own cancel is not a failure), unless `include`."""
    if include or not len(rows):
        return rows, 0
    errors = cols.error[rows]
    keep = (errors == "") | (errors == "client_cancel")
    return rows[keep], int((~keep).sum())


def window_profile(cols: trace.Columns, rows: np.ndarray) -> TraceProfile:
    """The replayed window's prefix reuse, by the definition `inspect` uses (trace.reuse)."""
    total = int(np.maximum(cols.input_tokens[rows], 0).sum()) if len(rows) else 0
    return TraceProfile(requests=len(rows), input_tokens=total, prefix_reuse=prefix_reuse(cols, rows))


def _probe_model(requested: Counter[Any], options: plan.PlanOptions) -> str:
    """The target name of the most requested model (of equals, the one requested first)."""
    return plan.model_for(str(requested.most_common(1)[0][0]) if requested else "", options)


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


def _live_replies(
    options: ReplayOptions,
    mode: turns.Mode,
    book: prompt_parts.Book | None,
    tokenizer_path: str,
    flavor: flavors.Flavor,
    target: Target,
    model: str,
) -> tuple[replies.Setup | None, str]:
    """Live replies in closed loop with an exact tokenizer (else each later turn as planned, and why);
    the senders load the local tokenizer at `tokenizer_path`, or call the engine's endpoint ("")."""
    if mode != "closed":
        return None, "planned: open loop sends every turn at its recorded time"
    if options.replies != "live":
        return None, "planned: --replies planned"
    return replies.setup_for(
        book, tokenizer_path, options.chat_template, flavor, target.url, model, options.headers
    )


def _checked(cols: trace.Columns, rows: np.ndarray) -> np.ndarray:
    """The first rows, as many as the checks use: their bodies equal the streamed ones, since a
    request's body depends only on the requests before it."""
    head = rows[:CHECKED_REQUESTS]
    tokens = np.cumsum(np.maximum(cols.input_tokens[head], 0))
    return head[: int(np.searchsorted(tokens, CHECKED_TOKENS)) + 1]


def _peak(cols: trace.Columns, planned: Schedule) -> int:
    if not len(planned.trace_index):
        return 0
    rows = planned.trace_index
    durations = schedule.estimate_e2e_ns(cols.e2e_ns[rows], cols.output_tokens[rows])
    return schedule.peak_concurrency(planned.scheduled_ns, durations)
