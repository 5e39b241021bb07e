"""Result files: what one replay run measured, per request (.rpr), and what one output check saw (.rpc).

The replayer writes them, reports read them. Same framing as traces (zstd frames of column-wise
msgpack batches, see replayproxy.trace); the header carries the measurement contract of the run
(DESIGN.md): trace digest, target, the engine's /v1/models answer and version, options,
replayproxy version, host and start time. Extra record types (e.g. engine telemetry samples)
travel as maps with their own `type` and are kept in `ResultFile.extras`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from replayproxy.shape import ErrorClass
from replayproxy.trace import ReadReport, TraceFormatError, expand_paths, storage
from replayproxy.trace.column_file import (
    ColumnFileData,
    ColumnFileWriter,
    read_column_file,
    read_each,
    with_defaults,
)
from replayproxy.trace.header import checked_fields
from replayproxy.trace.storage import Named, Source

FORMAT_NAME = "replayproxy-result"
FORMAT_VERSION = 1
SUFFIX = ".rpr"
UNKNOWN = -1


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One replayed request. Times are ns; `*_ns` after `sent_ns` are relative to the actual send."""

    index: int  # position of the request in the trace (pairs runs of the same trace)
    scheduled_ns: int  # when it should have been sent, relative to the run start
    sent_ns: int  # when its bytes were written, relative to the run start
    endpoint: str = "chat"
    stream: bool = True
    headers_ns: int = UNKNOWN  # response headers received
    ttft_ns: int = UNKNOWN  # first chunk carrying generated output
    e2e_ns: int = UNKNOWN  # end of body (or the failure)
    chunk_gaps_us: tuple[int, ...] = ()  # gaps between content chunks after the first
    chunk_tokens: tuple[int, ...] = ()  # tokens per content chunk, when the server reported them
    content_chunks: int = 0
    status: int = 0
    error: ErrorClass = ""
    error_message: str = ""  # status and the engine's error type, or our own reason; never body text
    expected_input_tokens: int = UNKNOWN  # from the trace
    expected_output_tokens: int = UNKNOWN
    prompt_tokens: int = UNKNOWN  # from the target's usage
    completion_tokens: int = UNKNOWN
    cached_tokens: int = UNKNOWN
    expected_shared_tokens: int = 0  # prompt prefix an earlier request of the trace had (tokens)
    new_connection: bool = False  # a connection had to be opened on the send path
    prepared_late: bool = False  # its body was not prepared by its scheduled time (the sender waited)
    worker: int = 0
    session: int = 0  # the trace's session id (0: not in a session)
    turn: int = 0  # 0-based turn within the session
    after: int = UNKNOWN  # trace index of the session's previous replayed turn
    think_ns: int = UNKNOWN  # think time the schedule gave after that turn's end (at the run's speed)

    def to_record(self) -> tuple[Any, ...]:
        values = [getattr(self, name) for name in RESULT_FIELDS]
        values[_GAPS] = _pack(self.chunk_gaps_us)
        values[_TOKENS] = _pack(self.chunk_tokens)
        return tuple(values)


RESULT_KINDS: dict[str, str] = {
    "index": "i8",
    "scheduled_ns": "i8",
    "sent_ns": "i8",
    "endpoint": "str",
    "stream": "b1",
    "headers_ns": "i8",
    "ttft_ns": "i8",
    "e2e_ns": "i8",
    "chunk_gaps_us": "ragged:u4",
    "chunk_tokens": "ragged:u4",
    "content_chunks": "i8",
    "status": "i8",
    "error": "str",
    "error_message": "str",
    "expected_input_tokens": "i8",
    "expected_output_tokens": "i8",
    "prompt_tokens": "i8",
    "completion_tokens": "i8",
    "cached_tokens": "i8",
    "expected_shared_tokens": "i8",
    "new_connection": "b1",
    "prepared_late": "b1",
    "worker": "i8",
    "session": "u8",
    "turn": "i8",
    "after": "i8",
    "think_ns": "i8",
}
RESULT_FIELDS = tuple(RESULT_KINDS)
_GAPS = RESULT_FIELDS.index("chunk_gaps_us")
_TOKENS = RESULT_FIELDS.index("chunk_tokens")
_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(ReplayResult) if f.default is not dataclasses.MISSING
}


def _pack(values: tuple[int, ...]) -> bytes:
    return np.minimum(np.asarray(values, dtype=np.int64), 0xFFFFFFFF).astype("<u4").tobytes()


class GpuFacts(TypedDict):
    """One GPU of the replayer's host, as `nvidia-smi` names it (memory with its unit)."""

    name: str
    memory_total: str
    driver: str


class RunContract(TypedDict, total=False):
    """The conditions of a run beyond the engine version and /v1/models (both in the header): what
    the replayer asked of the engine and the host, and what the user said. Written as a map, in
    this order; a key the writer could not learn is absent, and a reader keeps keys it does not
    know (a newer writer's) as they are."""

    max_model_len: int | None  # the context length the engine serves (vLLM's, else llama.cpp's per slot)
    engine_config: dict[str, Any]  # as the engine published it; engines name their keys apart
    gpus: list[GpuFacts]
    engine_args: str  # how the engine was started, as the user told it (--engine-args)
    note: str  # the user's --note


class RunWarmup(TypedDict, total=False):
    """The warm-up sent before the measured runs (`--warmup`), excluded from the results."""

    spec: str  # --warmup as given
    requests: int
    errors: int
    duration_s: float


class ClockReference(TypedDict):
    """This host's wall clock against the target's `Date` header (replay.clock_offset.against_date)."""

    source: str  # "target Date header"
    offset_ns: int  # local wall clock minus the target's
    bound_ns: int  # the offset is within this of the truth
    probes: int  # probes that were answered


class RunClock(TypedDict, total=False):
    """What a shard measured of its clock (replay.clock_offset.record); `start_at_ns` and
    `wall_drift_ns` only with --start-at, `reference` only when the target's Date could be read."""

    ready_before_start_ns: int
    start_at_ns: int
    wall_drift_ns: int
    reference: ClockReference


@dataclass(frozen=True, slots=True)
class RunHeader:
    """The measurement contract of one run (DESIGN.md, "A result file carries the contract")."""

    label: str
    target: str
    start_wall_ns: int
    trace_paths: tuple[str, ...] = ()
    trace_digest: str = ""  # sha256 of the trace files' bytes
    flavor: str = "openai"
    models: Any = None  # the target's /v1/models answer, as JSON
    engine_version: str = ""
    options: dict[str, Any] = field(default_factory=dict)  # replay options as given
    pre_run: dict[str, Any] = field(default_factory=dict)  # e.g. {"reset_prefix_cache": "ok"}
    replayproxy_version: str = ""
    host: str = ""
    token_timing: str = "chunk"  # "token" when per-chunk usage gave tokens per chunk
    shard: str = ""  # "i/N" when this run is one shard of a sharded replay
    repetition: int = 1  # with `replay --repeat K`: which of the K measured runs this is (1..K)
    repetitions: int = 1
    warmup: RunWarmup = field(default_factory=RunWarmup)
    contract: RunContract = field(default_factory=RunContract)
    clock: RunClock = field(default_factory=RunClock)  # this run's clock against a shared start

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record.update(
            type="header",
            format=FORMAT_NAME,
            version=FORMAT_VERSION,
            fields=list(RESULT_FIELDS),
            kinds=RESULT_KINDS,
            trace_paths=list(self.trace_paths),
        )
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunHeader:
        """The header of a result file, each entry of its declared type (TraceFormatError if not)."""
        return cls(**checked_fields(cls, record))


class ResultWriter:
    """Appends results to one .rpr file; one frame per `frame_records` so a crash loses little."""

    def __init__(self, path: str | os.PathLike[str], header: RunHeader, frame_records: int = 2048) -> None:
        # An object-store URL (a replay pod's results): written here, uploaded whole on close.
        self._url = os.fspath(path) if storage.is_url(os.fspath(path)) else ""
        local = storage.staging_path(self._url) if self._url else Path(path)
        self._file = ColumnFileWriter(local, header.to_record(), level=3, exclusive=False)
        self._frame_records = frame_records

    @property
    def path(self) -> Path:
        return self._file.path

    def write(self, result: ReplayResult) -> None:
        self._file.add(result.to_record())
        if self._file.pending >= self._frame_records:
            self._file.flush()

    def write_extra(self, record_type: str, payload: Mapping[str, Any]) -> None:
        """A side record (telemetry samples, sampler output) in its own frame."""
        self._file.write_side_record({"type": record_type, **payload})

    def close(self, **footer: Any) -> None:
        self._file.close(footer)
        if self._url:
            storage.upload_staged(self._file.path, self._url)

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class ResultFile:
    """One run loaded: its header, per-request columns and any side records."""

    path: Source
    header: RunHeader
    table: ColumnFileData
    extras: dict[str, list[dict[str, Any]]]
    footer: dict[str, Any]

    def __len__(self) -> int:
        return self.table.n

    def column(self, name: str) -> np.ndarray:
        return self.table.columns[name]

    def ragged(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(flat values, index) with request i's values at flat[index[i]:index[i + 1]]."""
        flat, lengths = self.table.ragged[name]
        return flat, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def load_results(paths: Iterable[Named], report: ReadReport | None = None) -> list[ResultFile]:
    """Every result file named (files, directories, globs), in name order; of several, unreadable
    ones are skipped and reported."""
    report = report if report is not None else ReadReport()
    return read_each(expand_paths(paths, SUFFIX), lambda path: _read_result(path, report), report)


def _read_result(path: Source, report: ReadReport) -> ResultFile:
    extras: dict[str, list[dict[str, Any]]] = {}
    footer: dict[str, Any] = {}
    table = read_column_file(
        path, FORMAT_NAME, FORMAT_VERSION, report, expected=RESULT_KINDS, extras=extras, footer=footer
    )
    try:
        header = RunHeader.from_record(table.header)
    except TraceFormatError as e:
        raise TraceFormatError(f"{path}: {e}") from e
    with_defaults(table, RESULT_KINDS, _DEFAULTS)
    return ResultFile(path, header, table, extras, footer)


def _row_kinds() -> dict[str, str]:
    kinds = {"run": "str"}
    for name, kind in RESULT_KINDS.items():
        kinds[name] = kind
        if name.endswith("_ns"):
            kinds[name[:-3] + "_ms"] = "f8"
        elif name == "chunk_gaps_us":
            kinds["chunk_gaps_ms"] = "ragged:f8"
    return kinds


# One row per request for pandas / DuckDB (`replayproxy export RESULT.rpr`): the run's label, every
# result field, and each time again in ms (null where unknown); docs/results-format.md.
ROW_KINDS = _row_kinds()


def request_rows(files: Iterable[ResultFile]) -> Iterator[dict[str, Any]]:
    """Every request of every file as one flat row (lists for the per-chunk fields)."""
    for file in files:
        columns: dict[str, list[Any]] = {}
        for name in RESULT_FIELDS:
            if name in file.table.ragged:
                flat, index = file.ragged(name)
                values = flat.tolist()
                columns[name] = [
                    values[a:b] for a, b in zip(index[:-1].tolist(), index[1:].tolist(), strict=True)
                ]
            elif name in file.table.columns:
                columns[name] = file.column(name).tolist()
        for i in range(len(file)):
            row: dict[str, Any] = {"run": file.header.label}
            for name in ROW_KINDS:
                if name in columns:
                    row[name] = columns[name][i]
            for name in RESULT_FIELDS:
                if name.endswith("_ns") and name in row:
                    row[name[:-3] + "_ms"] = row[name] / 1e6 if row[name] >= 0 else None
            if "chunk_gaps_us" in row:
                row["chunk_gaps_ms"] = [gap / 1e3 for gap in row["chunk_gaps_us"]]
            yield {name: row[name] for name in ROW_KINDS if name in row}


# Check results (.rpc): what an output check saw, one row per (target, prompt, repeat).

CHECK_FORMAT_NAME = "replayproxy-check"
CHECK_FORMAT_VERSION = 1
CHECK_SUFFIX = ".rpc"
NOT_APPLICABLE = -1  # a tri-state field (json_valid, ...) that does not apply to the prompt


@dataclass(frozen=True, slots=True)
class CheckRow:
    """One answer. Texts appear only in `output`, and only when the run kept outputs."""

    target: str  # the target's label
    prompt_index: int  # position in the prompt set (pairs rows across targets)
    prompt_id: str  # the prompt's `id` from the prompt file, else its line number
    repeat: int  # 0 .. repeat-1
    endpoint: str = "chat"  # "chat" | "completion"
    messages: int = 0  # chat messages in the request (0 for completions)
    has_stop: bool = False  # the request carried `stop`
    structure: str = ""  # "", "json_object", "json_schema" or "tools": what the request asks for
    has_reference: bool = False
    status: int = 0  # HTTP status; 0 when no response came
    error: ErrorClass = ""  # "" on success
    error_message: str = ""  # short; never request or answer text
    e2e_ns: int = UNKNOWN
    prompt_tokens: int = UNKNOWN  # from the target's usage
    completion_tokens: int = UNKNOWN
    finish_reason: str = ""
    output_chars: int = UNKNOWN
    output_hash: str = ""  # keyed hash of the answer (text and tool calls), comparable within one file
    tool_calls: int = 0
    json_valid: int = NOT_APPLICABLE  # 1/0: the answer parses as JSON (json_object / json_schema)
    schema_valid: int = NOT_APPLICABLE  # 1/0: it validates against the request's json_schema
    tool_valid: int = NOT_APPLICABLE  # 1/0: every tool call parses and names a declared tool
    similarity_ppm: int = UNKNOWN  # 0..1e6: similarity to the baseline's first answer to this prompt
    reference_exact: int = NOT_APPLICABLE  # 1/0: equals the prompt's reference answer
    reference_similarity_ppm: int = UNKNOWN  # 0..1e6: similarity to the reference answer
    score: str = ""  # the user scorer's number (`--score CMD`) as it printed it, "" when none
    output: str = ""  # the answer's text, only with --keep-outputs

    def to_record(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in CHECK_FIELDS)


CHECK_KINDS: dict[str, str] = {
    "target": "str",
    "prompt_index": "i8",
    "prompt_id": "str",
    "repeat": "i8",
    "endpoint": "str",
    "messages": "i8",
    "has_stop": "b1",
    "structure": "str",
    "has_reference": "b1",
    "status": "i8",
    "error": "str",
    "error_message": "str",
    "e2e_ns": "i8",
    "prompt_tokens": "i8",
    "completion_tokens": "i8",
    "finish_reason": "str",
    "output_chars": "i8",
    "output_hash": "str",
    "tool_calls": "i8",
    "json_valid": "i8",
    "schema_valid": "i8",
    "tool_valid": "i8",
    "similarity_ppm": "i8",
    "reference_exact": "i8",
    "reference_similarity_ppm": "i8",
    "score": "str",
    "output": "str",
}
CHECK_FIELDS = tuple(CHECK_KINDS)


@dataclass(frozen=True, slots=True)
class CheckTarget:
    """One candidate of a check: where it was, what it said it is."""

    label: str
    url: str
    flavor: str = "openai"
    models: Any = None  # the /v1/models answer, as JSON
    engine_version: str = ""


class PinnedSampling(TypedDict, total=False):
    """The sampling every target of a check got (check.requests.Sampling)."""

    temperature: float
    seed: int
    max_tokens: int
    ignore_eos: bool
    stream: bool


@dataclass(frozen=True, slots=True)
class CheckHeader:
    """The contract of one output check: targets, baseline, pinned sampling and the prompt set."""

    start_wall_ns: int
    targets: tuple[CheckTarget, ...]
    baseline: str  # label of the target the others are compared with
    sampling: PinnedSampling = field(default_factory=PinnedSampling)
    repeat: int = 1
    warmup: int = 0
    concurrency: int = 1
    prompts: str = ""  # the prompt file's path, or "builtin"
    prompts_digest: str = ""  # sha256 of the prompt file's bytes
    prompt_count: int = 0
    keep_outputs: bool = False
    scored: bool = False  # a user scorer filled `score`
    replayproxy_version: str = ""
    host: str = ""

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record.update(
            type="header",
            format=CHECK_FORMAT_NAME,
            version=CHECK_FORMAT_VERSION,
            fields=list(CHECK_FIELDS),
            kinds=CHECK_KINDS,
            targets=[asdict(t) for t in self.targets],
        )
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CheckHeader:
        """The header of a check file, each entry of its declared type (TraceFormatError if not)."""
        return cls(**checked_fields(cls, record))


class CheckWriter:
    """Writes one .rpc file: rows as they are scored, then a footer with the run's counts."""

    def __init__(self, path: str | os.PathLike[str], header: CheckHeader) -> None:
        self._file = ColumnFileWriter(Path(path), header.to_record(), level=3, exclusive=False)

    @property
    def path(self) -> Path:
        return self._file.path

    def write(self, row: CheckRow) -> None:
        self._file.add(row.to_record())

    def close(self, **footer: Any) -> None:
        self._file.close(footer)


@dataclass(slots=True)
class CheckFile:
    """One check loaded: its header, its rows as columns and its footer."""

    path: Source
    header: CheckHeader
    table: ColumnFileData
    footer: dict[str, Any]

    def __len__(self) -> int:
        return self.table.n

    def column(self, name: str) -> np.ndarray:
        return self.table.columns[name]


def load_checks(paths: Iterable[Named], report: ReadReport | None = None) -> list[CheckFile]:
    """Every check file named (files, directories, globs), in name order."""
    report = report if report is not None else ReadReport()
    loaded = []
    for path in expand_paths(paths, CHECK_SUFFIX):
        footer: dict[str, Any] = {}
        table = read_column_file(
            path, CHECK_FORMAT_NAME, CHECK_FORMAT_VERSION, report, expected=CHECK_KINDS, footer=footer
        )
        with_defaults(table, CHECK_KINDS, _CHECK_DEFAULTS)
        try:
            header = CheckHeader.from_record(table.header)
            _check_counts(header, table)
        except TraceFormatError as e:
            raise TraceFormatError(f"{path}: {e}") from e
        loaded.append(CheckFile(path, header, table, footer))
    return loaded


_CHECK_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(CheckRow) if f.default is not dataclasses.MISSING
}
CHECK_MAX_REPEAT = 1000  # answers per prompt and target at most (a report indexes prompts x repeats)


def _check_counts(header: CheckHeader, table: ColumnFileData) -> None:
    """The header's counts hold what can exist and agree with the rows, before a report sizes its
    tables by them: each row names a target of the header, a prompt below `prompt_count` and a
    repeat below `repeat`."""
    labels = [t.label for t in header.targets]
    if not labels or len(set(labels)) != len(labels) or header.baseline not in labels:
        raise TraceFormatError(f"header's targets {labels} and baseline {header.baseline!r} do not agree")
    if header.prompt_count < 0 or not 1 <= header.repeat <= CHECK_MAX_REPEAT:
        raise TraceFormatError(
            f"header's prompt_count {header.prompt_count} or repeat {header.repeat} is out of range"
            f" (prompt_count >= 0, repeat 1..{CHECK_MAX_REPEAT})"
        )
    columns = table.columns
    if table.n and not all(name in columns for name in ("target", "prompt_index", "repeat")):
        raise TraceFormatError("rows lack their target, prompt_index or repeat")
    if not table.n:
        return
    for name, limit in (("prompt_index", header.prompt_count), ("repeat", header.repeat)):
        values = columns[name]
        if int(values.min()) < 0 or int(values.max()) >= limit:
            raise TraceFormatError(f"a row's {name} is outside 0..{limit - 1} (the header's count)")
    unknown = set(map(str, columns["target"].tolist())) - set(labels)
    if unknown:
        raise TraceFormatError(f"rows name targets the header does not list: {sorted(map(str, unknown))[:3]}")
