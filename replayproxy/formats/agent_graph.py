"""Agent sessions as request graphs: what the Copilot, WEKA and Dynamo importers share.

A reader hands each session here as a list of `Call`s (in start order) whose links name earlier
calls of the same session: `parent` (the call it continues, or for a spawned sub-agent only waits
on) and `joins` (further calls whose replies it waits for). `SessionGraphs` turns them into the
trace's graph fields (docs/trace-format.md): `chat_id` / `parent_id` / `join_ids` numbered per
session, `spawned`, `turn` = depth (longest path from a root), `think_ns` = from the last-ending
dependency to the arrival (unless the source states its own wait), and prefix block ids — the
source's own, or, for sources that only count cached tokens, the parent's first
`cached // block` blocks followed by fresh ones. Columns go to temporary files a batch of rows at
a time, so memory follows one session, not the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from replayproxy.formats.chained_hashes import ChainedHashes
from replayproxy.formats.importing import BadLines, Imported, Ragged, SpilledColumns, key_of
from replayproxy.shape import UNKNOWN, ErrorClass
from replayproxy.trace.mapped import SpilledArray

MAX_CALLS = 1 << 20  # requests of one session: past this a file is damaged, not an agent
MAX_JOINS = 4096  # replies one request waits for besides its parent
FLUSH_ROWS = 1 << 15  # rows gathered before they go to the temporary files


@dataclass(slots=True)
class Call:
    """One LLM request of an agent session as a source gives it; times in nanoseconds."""

    start_ns: int  # arrival (any origin shared by the file)
    inputs: int
    outputs: int
    e2e_ns: int = UNKNOWN
    ttft_ns: int = UNKNOWN
    cached: int = UNKNOWN  # prompt tokens the source reports as served from cache
    ids: np.ndarray | None = None  # the source's block ids of the whole prompt (int64); None: synthesized
    parent: int = -1  # index of the call it continues (or, spawned, waits on); -1: a root
    joins: tuple[int, ...] = ()  # indices of further calls whose replies it waits for
    spawned: bool = False
    think_ns: int = UNKNOWN  # the source's own wait after its dependencies; UNKNOWN: measured
    model: str = ""
    stream: bool = True
    error: ErrorClass = ""  # the source marks it failed (its status becomes 0)


_NUMBERS = {
    "offset_ns": np.int64, "inputs": np.int64, "outputs": np.int64, "e2e_ns": np.int64,
    "ttft_ns": np.int64, "cached": np.int64, "session": np.uint64, "turn": np.int64,
    "think_ns": np.int64, "chat_id": np.uint64, "parent_id": np.uint64, "spawned": np.bool_,
    "stream": np.bool_, "status": np.int64, "join_counts": np.int64,
}  # fmt: skip


@dataclass(slots=True)
class GraphTally:
    """What the import says about the graphs it built (header `extra` and the printed summary)."""

    sessions: int = 0
    requests: int = 0
    roots: int = 0
    spawned: int = 0
    joins: int = 0  # join edges
    branches: int = 0  # requests that share their parent with an earlier sibling (run in parallel)
    max_depth: int = 0
    reused_blocks: int = 0  # synthesized: blocks taken over from the parent for cached tokens

    def as_extra(self) -> dict[str, int]:
        return {f"graph_{name}": value for name, value in asdict(self).items()}


@dataclass
class SessionGraphs:
    """Sessions in, `Imported` columns out (see the module docstring)."""

    source: str
    block: int
    model: str = ""  # --model: overrides the sources' model names
    local_ids: bool = False  # the source numbers blocks per session (WEKA): keep sessions apart
    tally: GraphTally = field(default_factory=GraphTally)

    def __post_init__(self) -> None:
        self._spilled = SpilledColumns(**_NUMBERS)
        self._hashes = ChainedHashes(self.block)
        self._joins = SpilledArray(np.dtype(np.uint64))
        self._rows: dict[str, list[Any]] = {name: [] for name in _NUMBERS}
        self._models: list[str] = []
        self._errors: list[str] = []
        self._ids: list[np.ndarray] = []
        self._id_counts: list[int] = []
        self._fresh = 0  # synthesized blocks so far (numbered -1, -2, ...: never a source's id)
        self._id_base = 0  # local-scope ids: this session's ids are shifted past all earlier ones

    def add(self, name: str, calls: Sequence[Call]) -> None:
        """One session; `name` is the source's session id (kept as a public 63-bit key)."""
        if not calls:
            return
        session = key_of(f"{self.source}\x00{name}")
        chat = [key_of(f"{session:x}:{i}") for i in range(len(calls))]
        depth = [0] * len(calls)
        ends = [c.start_ns + c.e2e_ns if c.e2e_ns >= 0 else UNKNOWN for c in calls]
        ids_of: list[np.ndarray] = []
        base = self._id_base
        seen_parents: set[int] = set()
        rows = self._rows
        for i, call in enumerate(calls):
            deps = ([call.parent] if call.parent >= 0 else []) + list(call.joins)
            depth[i] = 1 + max(depth[d] for d in deps) if deps else 0
            think = call.think_ns
            if think < 0 and deps and all(ends[d] >= 0 for d in deps):
                think = max(call.start_ns - max(ends[d] for d in deps), 0)
            ids = self._block_ids(
                call, ids_of[call.parent] if call.parent >= 0 and not call.spawned else None
            )
            if call.ids is not None and self.local_ids:
                ids = ids + base
                self._id_base = max(self._id_base, int(ids.max()) + 1 if len(ids) else 0)
            ids_of.append(ids)
            self._ids.append(ids)
            self._id_counts.append(len(ids))
            self._models.append(self.model or call.model)
            self._errors.append(call.error)
            values = (
                call.start_ns, call.inputs, call.outputs, call.e2e_ns, call.ttft_ns, call.cached, session,
                depth[i], think, chat[i], chat[call.parent] if call.parent >= 0 else 0, call.spawned,
                call.stream, 0 if call.error else 200, len(call.joins),
            )  # fmt: skip
            for column, value in zip(rows.values(), values, strict=True):
                column.append(value)
            if call.joins:
                self._joins.extend(np.array([chat[j] for j in call.joins], np.uint64))
            tally = self.tally
            tally.roots += not deps
            tally.spawned += call.spawned
            tally.joins += len(call.joins)
            if call.parent >= 0:
                tally.branches += call.parent in seen_parents
                seen_parents.add(call.parent)
        self.tally.sessions += 1
        self.tally.requests += len(calls)
        self.tally.max_depth = max(self.tally.max_depth, max(depth))
        if len(rows["offset_ns"]) >= FLUSH_ROWS:
            self._flush()

    def _block_ids(self, call: Call, parent_ids: np.ndarray | None) -> np.ndarray:
        """The source's ids, or the parent's first `cached // block` blocks and fresh ones after."""
        if call.ids is not None:
            return np.asarray(call.ids, np.int64)
        full = max(call.inputs, 0) // self.block
        reuse = 0
        if parent_ids is not None and call.cached > 0:
            reuse = min(call.cached // self.block, len(parent_ids), full)
        self.tally.reused_blocks += reuse
        fresh = -1 - self._fresh - np.arange(full - reuse, dtype=np.int64)
        self._fresh += full - reuse
        return np.concatenate([parent_ids[:reuse], fresh]) if parent_ids is not None and reuse else fresh

    def _flush(self) -> None:
        rows = self._rows
        if not rows["offset_ns"]:
            return
        self._spilled.add(**{name: np.array(values, _NUMBERS[name]) for name, values in rows.items()})
        self._spilled.add_strings("model", self._models)
        self._spilled.add_strings("error", self._errors)
        ids = np.concatenate(self._ids) if self._ids else np.zeros(0, np.int64)
        self._hashes.add(ids, np.array(self._id_counts, np.int64), np.array(rows["inputs"], np.int64))
        for values in rows.values():
            values.clear()
        self._models, self._errors, self._ids, self._id_counts = [], [], [], []

    def imported(self, bad: BadLines, **options: Any) -> Imported:
        """Everything added, as an importer's result (`options`: wall_clock, extra, warnings)."""
        self._flush()
        parts = self._spilled.result()
        columns: dict[str, Any] = {
            name: parts[column]
            for name, column in (
                ("session", "session"), ("turn", "turn"), ("think_ns", "think_ns"),
                ("chat_id", "chat_id"), ("parent_id", "parent_id"), ("spawned", "spawned"),
                ("e2e_ns", "e2e_ns"), ("ttft_ns", "ttft_ns"), ("cached_tokens", "cached"),
                ("stream", "stream"), ("status", "status"),
            )
            if column in parts
        }  # fmt: skip
        for name in ("model", "error"):
            if name in parts:
                columns[name] = parts[name]
        if "join_counts" in parts:
            columns["join_ids"] = Ragged(self._joins.result(), parts["join_counts"])
        empty = np.zeros(0, np.int64)
        extra = {**self.tally.as_extra(), **options.pop("extra", {})}
        return Imported(
            source=self.source,
            offset_ns=parts.get("offset_ns", empty),
            input_tokens=parts.get("inputs", empty),
            output_tokens=parts.get("outputs", empty),
            bad=bad,
            block_size=self.block,
            hashes=self._hashes,
            columns=columns,
            extra=extra,
            **options,
        )


def seconds_within(value: Any, high: float) -> float | None:
    """`value` as a float when it is a number (not a boolean) within 0..high, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= high:
        return float(value)
    return None


def add_linked(graphs: SessionGraphs, sessions: Sequence[str], calls: Sequence[Call]) -> int:
    """Calls of a whole file whose `parent` / `joins` index `calls` itself, added session by
    session (each sorted by arrival, links renumbered). A link to another session, or to a call
    that arrives later, is dropped (the call then falls back to its recorded arrival); returns how
    many were dropped."""
    members: dict[str, list[int]] = {}
    for row, name in enumerate(sessions):
        members.setdefault(name, []).append(row)
    dropped = 0
    for name, rows in members.items():
        rows.sort(key=lambda row: (calls[row].start_ns, row))
        local = {row: i for i, row in enumerate(rows)}
        session: list[Call] = []
        for i, row in enumerate(rows):
            call = calls[row]
            links = [call.parent, *call.joins] if call.parent >= 0 else list(call.joins)
            kept = [local[r] for r in links if local.get(r, i) < i]
            dropped += len(links) - len(kept)
            if call.parent >= 0 and kept and local.get(call.parent, i) < i:
                call.parent, call.joins = kept[0], tuple(kept[1:])
            else:
                call.parent, call.joins, call.spawned = -1, tuple(kept), False
                if call.joins:  # the first surviving dependency becomes the one it continues
                    call.parent, call.joins = call.joins[0], call.joins[1:]
            session.append(call)
        graphs.add(name, session)
    return dropped
