"""Result files -> runs: shards of one run merged into one column; repetitions numbered.

A run's label is the `--label` given at replay time, else "target model", and it is kept as given:
runs of one label at one speed are repetitions of one candidate (numbered 1..K in file order), not
different things to be told apart by a mangled name. Shards of a sharded replay (RunHeader.shard
"i/N", same label, target and trace digest) become one run; their send times are put on one time
line through each shard's start wall time.

Results are read defensively (`read_runs`): a file read only in part (a truncated tail, a damaged
frame, no footer because its writer never finished) is kept with what was read and named, so the
caller can refuse it; a second copy of one run (the same header and the same measured times to the
nanosecond, e.g. a copied file) is counted once and named.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replayproxy.errors import BadInputFile
from replayproxy.report import telemetry
from replayproxy.report.measures import NS_PER_MS, Measures, Requests, measure
from replayproxy.report.stats import summarize
from replayproxy.results import ResultFile, RunClock, RunHeader, load_results
from replayproxy.trace import ReadReport


@dataclass(slots=True)
class Run:
    """One column of the report: a replay run (maybe merged from shards) or the production baseline."""

    label: str
    kind: str  # "replay" | "baseline"
    measures: Measures
    paths: tuple[str, ...] = ()
    target: str = ""
    model: str = ""
    trace_digest: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    token_timing: str = "chunk"
    shards: int = 1
    headers: tuple[RunHeader, ...] = ()
    extras: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # side records, e.g. telemetry
    footer: dict[str, Any] = field(default_factory=dict)
    repetition: int = 1  # 1..repetitions among the runs of this label at this speed
    repetitions: int = 1
    cancelled: int = 0  # requests cut off by an interruption, left out of every figure
    prepared_late: int = 0  # requests sent late because their bodies were not prepared in time
    at_speed: bool = False  # the label was replayed at several loads: headings name the load
    damage: tuple[str, ...] = ()  # what made its files readable only in part (figures cover what was read)
    shard_clocks: tuple[ShardClock, ...] = ()  # per shard: its schedule lag p99 and clock

    @property
    def speed(self) -> float | None:
        value = self.options.get("speed")
        return float(value) if isinstance(value, int | float) else None

    @property
    def concurrency_limit(self) -> int:
        value = self.options.get("max_concurrency")
        return value if isinstance(value, int) and value > 0 else 0

    @property
    def load(self) -> tuple[float | None, int]:
        """The load a run was replayed at: speed and concurrency limit (sweep steps differ in it)."""
        return self.speed, self.concurrency_limit

    @property
    def candidate(self) -> tuple[str, tuple[float | None, int]]:
        """What repetitions share: the label and the load."""
        return self.label, self.load

    @property
    def name(self) -> str:
        """The column heading: the label, and which repetition when there are several."""
        name = self.label
        if self.at_speed:
            name += (
                f" at concurrency {self.concurrency_limit}"
                if self.concurrency_limit
                else f" at {self.speed:g}x"
            )
        return f"{name} (run {self.repetition}/{self.repetitions})" if self.repetitions > 1 else name

    @property
    def partial(self) -> bool:
        return bool(self.footer.get("summary", {}).get("partial"))

    @property
    def stopped_after_s(self) -> float | None:
        value = self.footer.get("summary", {}).get("stopped_after_s")
        return float(value) if isinstance(value, int | float) else None


def model_of(header: RunHeader) -> str:
    """The model the run asked for: the --model option, else the first id in the /v1/models answer."""
    model = header.options.get("model")
    if isinstance(model, str) and model:
        return model
    models = header.models
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        first = models["data"][0]
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return str(first["id"])
    return ""


@dataclass(slots=True)
class Loaded:
    """Runs as read, and what the reading saw besides: files read in part or not at all, copies."""

    runs: list[Run]
    damaged: list[str]  # one line per file read in part or skipped; the runs' figures cover what was read
    duplicates: list[str]  # one line per copy of a run already read, left out


def read_runs(paths: Iterable[str | os.PathLike[str]]) -> Loaded:
    """Load result files, merge shards, leave out copies, and name every file read in part."""
    report = ReadReport()
    files = load_results(paths, report)
    damaged = [w for w in report.warnings if ": skipped: " in w]  # of several, files not read at all
    damage: dict[str, list[str]] = {}
    for f in files:
        name = str(f.path)
        seen = [w.removeprefix(f"{name}: ") for w in report.warnings if w.startswith(f"{name}: ")]
        if not seen and not f.footer:
            seen.append("no footer: the file ends early (its writer did not finish)")
        if seen:
            damage[name] = seen
            damaged.append(f"{name}: read in part ({'; '.join(seen)}): {len(f)} requests read")
    files, duplicates = _without_copies(files)
    groups: dict[tuple[str, ...], list[ResultFile]] = {}
    for f in files:
        h = f.header
        key: tuple[str, ...] = (str(f.path),)
        if h.shard:
            key = ("shard", h.label, h.target, h.trace_digest, h.shard.partition("/")[2])
        groups.setdefault(key, []).append(f)
    runs = [_run(group) for group in groups.values()]
    for run in runs:
        run.damage = tuple(d for path in run.paths for d in damage.get(path, ()))
    number_repetitions(runs)
    return Loaded(runs, damaged, duplicates)


def load_runs(paths: Iterable[str | os.PathLike[str]]) -> list[Run]:
    """The runs of `read_runs`, for a caller that reads the files it has just written itself."""
    return read_runs(paths).runs


def _without_copies(files: list[ResultFile]) -> tuple[list[ResultFile], list[str]]:
    """The first file of each run; a later one with the same header and the same measured times
    (to the nanosecond: no two runs share them) is a copy, left out and named."""
    first: dict[str, str] = {}
    kept, copies = [], []
    for f in files:
        digest = _run_digest(f)
        if digest in first:
            copies.append(f"{f.path} is a copy of {first[digest]} (the same run): counted once")
            continue
        first[digest] = str(f.path)
        kept.append(f)
    return kept, copies


def _run_digest(f: ResultFile) -> str:
    h = f.header
    digest = hashlib.sha256(
        repr((h.label, h.target, h.start_wall_ns, h.shard, h.repetition, len(f))).encode()
    )
    for name in ("index", "sent_ns", "ttft_ns", "e2e_ns"):
        digest.update(np.ascontiguousarray(f.column(name)).tobytes())
    return digest.hexdigest()


def number_repetitions(runs: list[Run]) -> None:
    """Runs of one label at one speed are repetitions: number them in order."""
    speeds: dict[str, set[tuple[float | None, int]]] = {}
    for run in runs:
        speeds.setdefault(run.label, set()).add(run.load)
    for run in runs:
        run.at_speed = len(speeds[run.label]) > 1
    for group in candidates(runs):
        for i, run in enumerate(group, 1):
            run.repetition, run.repetitions = i, len(group)


def candidates(runs: list[Run]) -> list[list[Run]]:
    """Replay runs grouped by candidate (label and speed), in order of first appearance."""
    groups: dict[tuple[str, tuple[float | None, int]], list[Run]] = {}
    for run in runs:
        groups.setdefault(run.candidate, []).append(run)
    return list(groups.values())


def _run(files: list[ResultFile]) -> Run:
    seen: dict[str, str] = {}
    for f in files:
        if f.header.shard in seen:
            raise BadInputFile(
                f"{f.path} and {seen[f.header.shard]} are both shard {f.header.shard} of one run; "
                "pass one run's shard files at a time"
            )
        seen[f.header.shard] = str(f.path)
    header = files[0].header
    model = model_of(header)
    extras: dict[str, list[dict[str, Any]]] = {}
    for f in files:
        for kind, records in f.extras.items():
            if kind == "telemetry":
                records = [r for r in records if telemetry.well_formed(r)]
            extras.setdefault(kind, []).extend(records)
    requests = _requests(files)
    partial = any(f.footer.get("summary", {}).get("partial") for f in files)
    # An interrupted run's in-flight requests were cut off by us, not failed by the engine.
    cut_off = (requests.error == "client_cancel") if partial else np.zeros(len(requests), bool)
    return Run(
        label=header.label or " ".join(p for p in (header.target, model) if p),
        kind="replay",
        measures=measure(requests.subset(~cut_off) if cut_off.any() else requests),
        paths=tuple(str(f.path) for f in files),
        target=header.target,
        model=model,
        trace_digest=header.trace_digest,
        options=dict(header.options),
        token_timing=header.token_timing,
        shards=len(files),
        headers=tuple(f.header for f in files),
        extras=extras,
        footer=files[0].footer,
        cancelled=int(cut_off.sum()),
        prepared_late=sum(int(f.column("prepared_late").sum()) for f in files),
        shard_clocks=tuple(_shard_clock(f) for f in files) if len(files) > 1 or header.clock else (),
    )


class ShardClock(RunClock):
    """One shard's schedule lag p99 (on its own clock) beside what it measured of that clock."""

    shard: str
    lag_p99_ms: float  # NaN without a sent request


def _shard_clock(f: ResultFile) -> ShardClock:
    sent, scheduled = f.column("sent_ns"), f.column("scheduled_ns")
    lag = (sent - scheduled)[(sent >= 0) & (scheduled >= 0)]
    p99 = summarize(lag / NS_PER_MS).p99 if len(lag) else math.nan
    return ShardClock(shard=f.header.shard, lag_p99_ms=p99, **f.header.clock)


def _requests(files: list[ResultFile]) -> Requests:
    base_ns = min(f.header.start_wall_ns for f in files)

    def col(name: str) -> np.ndarray:
        return np.concatenate([f.column(name) for f in files])

    def shifted(name: str) -> np.ndarray:
        parts = []
        for f in files:
            values = f.column(name)
            parts.append(np.where(values >= 0, values + (f.header.start_wall_ns - base_ns), values))
        return np.concatenate(parts)

    def ragged(name: str) -> tuple[np.ndarray, np.ndarray]:
        flat = np.concatenate([f.table.ragged[name][0] for f in files])
        lengths = np.concatenate([f.table.ragged[name][1] for f in files])
        return flat, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def optional(name: str) -> np.ndarray:
        """A column older result files lack: empty then (the figure is left out)."""
        if all(name in f.table.columns for f in files):
            return col(name)
        return np.zeros(0, np.int64)

    gaps, gap_index = ragged("chunk_gaps_us")
    tokens, token_index = ragged("chunk_tokens")
    prompt = col("prompt_tokens")
    expected_input = col("expected_input_tokens")
    return Requests(
        index=col("index"),
        scheduled_ns=shifted("scheduled_ns"),
        sent_ns=shifted("sent_ns"),
        endpoint=col("endpoint"),
        stream=col("stream"),
        error=col("error"),
        ttft_ns=col("ttft_ns"),
        e2e_ns=col("e2e_ns"),
        gaps_us=gaps,
        gap_index=gap_index,
        chunk_tokens=tokens,
        token_index=token_index,
        content_chunks=col("content_chunks"),
        input_tokens=np.where(prompt >= 0, prompt, expected_input),
        output_tokens=col("completion_tokens"),
        expected_input_tokens=expected_input,
        expected_output_tokens=col("expected_output_tokens"),
        expected_shared_tokens=col("expected_shared_tokens")
        if all("expected_shared_tokens" in f.table.columns for f in files)
        else np.zeros(0, np.int64),
        session=optional("session"),
        after=optional("after"),
        think_ns=optional("think_ns"),
        cached_tokens=optional("cached_tokens"),
        turn=optional("turn"),
    )
