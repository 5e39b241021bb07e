"""AIPerf DAG JSON lines (`--custom-dataset-type dag_jsonl`): a trace's session graphs as AIPerf's
conversations with forks and spawns, each turn's literal `messages` from the replayer's prompts.

AIPerf's model (aiperf/dataset/loader/dag_jsonl_models.py): a line is a conversation, a list of
turns; a turn's `messages` are appended to the conversation's accumulator (default context mode
`deltas_without_responses`: earlier turns' messages, not the replies). After a turn, `forks` start
child conversations that inherit the accumulator and are never joined (`background: true` keeps the
parent going), `spawns` start children with a fresh context that the parent waits for at turn
`join_at` (default: the next). `delay` is milliseconds before a turn goes.

The mapping: a request that continues its parent and is the parent's first such child extends the
parent's conversation; a further branch that continues the parent and is joined by nobody is a
fork; a request that opens its own context (`spawned`) and whose conversation a later turn of the
parent's conversation joins is a spawn with that `join_at`. What AIPerf cannot say is counted and
reported: a branch that continues its parent's context *and* is joined becomes a spawn (AIPerf
joins only spawns) whose first turn carries its whole prompt; a dependency with no place (its
parent not exported, a spawn nobody joins, a join from another conversation) leaves the request a
conversation of its own, started by AIPerf's schedule.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.formats.exporting import ExportOptions, ExportResult, output_lengths, write_json_lines
from replayproxy.trace import Columns


@dataclass(slots=True)
class Conversation:
    rows: list[int]  # trace rows, one per turn, in order
    inherits: bool = False  # a fork: the first turn's prompt continues the parent's accumulator


@dataclass(slots=True)
class DagPlan:
    """The conversations and their links, as trace rows; counts of what AIPerf cannot express."""

    conversations: list[Conversation] = field(default_factory=list)
    conversation_of: dict[int, int] = field(default_factory=dict)  # row -> conversation
    forks: dict[int, list[int]] = field(default_factory=dict)  # parent row -> child conversations
    spawns: dict[int, dict[int, list[int]]] = field(default_factory=dict)  # row -> join_at -> children
    joined_branches: int = 0  # context-continuing branches that were joined: spawns or roots
    dropped: int = 0  # dependencies with no place in AIPerf's model


def plan(cols: Columns) -> DagPlan:
    """Cut each session graph into conversations, forks and spawns (rows in arrival order)."""
    out = DagPlan()
    row_of = {int(c): i for i, c in enumerate(cols.chat_id.tolist()) if c}
    parent = [row_of.get(int(p), -1) if p else -1 for p in cols.parent_id.tolist()]
    joins = [[row_of.get(int(j), -1) for j in cols.joins_of(row).tolist()] for row in range(len(cols))]
    joined = {q for rows in joins for q in rows}
    spawned = cols.spawned.astype(bool).tolist()
    for row in range(len(cols)):
        p = parent[row]
        if p < 0:
            out.dropped += bool(cols.parent_id[row])  # its parent is not in the exported rows
            _open(out, row)
        elif not spawned[row] and out.conversations[out.conversation_of[p]].rows[-1] == p:
            out.conversations[out.conversation_of[p]].rows.append(row)
            out.conversation_of[row] = out.conversation_of[p]
        elif not spawned[row] and row not in joined:
            out.forks.setdefault(p, []).append(_open(out, row, inherits=True))
        else:
            _open(out, row)
            out.joined_branches += not spawned[row]
    _place_spawns(out, parent, joins)
    out.dropped += _unexpressed_joins(out, joins)
    return out


def _open(out: DagPlan, row: int, inherits: bool = False) -> int:
    out.conversations.append(Conversation([row], inherits))
    out.conversation_of[row] = len(out.conversations) - 1
    return out.conversation_of[row]


def _place_spawns(out: DagPlan, parent: list[int], joins: list[list[int]]) -> None:
    """A child conversation that is not a fork is a spawn of its parent's turn when a later turn of
    the parent's conversation joins the child's last turn: the first such turn is its `join_at`.
    Otherwise its parent link is dropped and it is a conversation of its own."""
    for index, conv in enumerate(out.conversations):
        p = parent[conv.rows[0]]
        if conv.inherits or p < 0:
            continue
        home = out.conversations[out.conversation_of[p]].rows
        at = [k for k, row in enumerate(home) if k > home.index(p) and conv.rows[-1] in joins[row]]
        if not at:
            out.dropped += 1
            continue
        out.spawns.setdefault(p, {}).setdefault(at[0], []).append(index)


def _unexpressed_joins(out: DagPlan, joins: list[list[int]]) -> int:
    """Joins the file does not carry: a joined request not earlier in the joining request's own
    conversation and not the last turn of a spawn that conversation waits for by then."""
    waits: dict[int, set[int]] = {}  # row -> last rows of the spawns joined at or before it
    for p, by_join in out.spawns.items():
        home = out.conversations[out.conversation_of[p]].rows
        for join_at, kids in by_join.items():
            for row in home[join_at:]:
                waits.setdefault(row, set()).update(out.conversations[c].rows[-1] for c in kids)
    count = 0
    for row, joined in enumerate(joins):
        own = out.conversations[out.conversation_of[row]].rows
        for q in joined:
            count += not ((q in own and own.index(q) < own.index(row)) or q in waits.get(row, set()))
    return count


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    if options.prompts is None:
        raise BadOption("aiperf-dag needs the replayer's prompt synthesis; run it via `replayproxy export`")
    dag = plan(cols)
    with tempfile.TemporaryFile(dir=path.parent) as spill:
        # Turn texts come in row order but are written by conversation: they wait in a file.
        ends = np.zeros(len(cols) + 1, np.int64)
        for row, text in enumerate(_turn_texts(cols, dag, options.prompts(cols))):
            ends[row + 1] = ends[row] + spill.write(text.encode())

        def text_of(row: int) -> str:
            spill.seek(int(ends[row]))
            return spill.read(int(ends[row + 1] - ends[row])).decode()

        lines = write_json_lines(path, conversation_lines(cols, dag, text_of))
    command = (
        f"AIPerf:   aiperf profile --model {options.model} --url {options.url} --endpoint-type chat "
        f"--streaming --input-file {path} --custom-dataset-type dag_jsonl --extra-inputs ignore_eos:true"
    )
    notes = [
        command,
        f"note: {len(cols)} requests as {lines} AIPerf conversations ({_roots(dag)} roots, started by "
        "AIPerf's own schedule: recorded session start times are not in this format)",
        "note: prompts are text: the server's tokenizer decides their token counts; each turn carries "
        "the tokens its prompt adds to the conversation's earlier ones (replies are not in AIPerf's "
        "accumulator, so a reply's tokens are sent as the next turn's text)",
    ]
    if dag.joined_branches:
        notes.append(
            f"note: {dag.joined_branches} joined branches that continue their parent's context became "
            "spawns (AIPerf joins only spawns, which start a fresh context): their whole prompt is sent"
        )
    if dag.dropped:
        notes.append(
            f"note: {dag.dropped} dependencies have no place in AIPerf's model (parent not exported, a "
            "spawn nobody in its parent's conversation joins, or a join across conversations)"
        )
    return ExportResult(len(cols), notes)


def _roots(dag: DagPlan) -> int:
    children = sum(len(kids) for kids in dag.forks.values())
    children += sum(len(kids) for by_join in dag.spawns.values() for kids in by_join.values())
    return len(dag.conversations) - children


def _turn_texts(cols: Columns, dag: DagPlan, prompts: Iterable[str]) -> Iterable[str]:
    """Per row, the text its turn adds: the tail of its prompt beyond the tokens its conversation
    (a fork: its parent's too) already holds, at least one word; a conversation's first turn
    carries its whole prompt. The replayer's prompts are words (one token each with a tokenizer)."""
    held = np.zeros(len(cols), np.int64)  # tokens already in the accumulator when the row goes
    parent_of_fork = {kids_row: p for p, kids in dag.forks.items() for kids_row in kids}
    for index, conv in enumerate(dag.conversations):
        before = int(cols.input_tokens[parent_of_fork[index]]) if index in parent_of_fork else 0
        for row in conv.rows:
            held[row] = before if conv.inherits or row != conv.rows[0] else 0
            before = int(cols.input_tokens[row])
    for row, prompt in enumerate(prompts):
        words = prompt.split(" ")
        keep = max(len(words) - int(held[row] * len(words) / max(int(cols.input_tokens[row]), 1)), 1)
        yield " ".join(words[-keep:])


def conversation_lines(
    cols: Columns, dag: DagPlan, text_of: Callable[[int], str]
) -> Iterable[dict[str, Any]]:
    """One JSON object per conversation, ids `s<session>-<n>` (n: its place in the file). A turn's
    delay is its recorded wait after the reply it follows; a root's first turn has none."""
    outputs = output_lengths(cols)[0].tolist()
    delays = [round(max(t, 0) / 1e6, 3) for t in cols.think_ns.tolist()]
    names = [f"s{int(cols.session[c.rows[0]]):x}-{n}" for n, c in enumerate(dag.conversations)]
    children = {c for kids in dag.forks.values() for c in kids}
    children |= {c for by_join in dag.spawns.values() for kids in by_join.values() for c in kids}
    for n, conv in enumerate(dag.conversations):
        turns = []
        for row in conv.rows:
            turn: dict[str, Any] = {
                "messages": [{"role": "user", "content": text_of(row)}],
                "max_tokens": outputs[row],
                "delay": delays[row] if row != conv.rows[0] or n in children else 0.0,
            }
            if row in dag.forks:
                turn["forks"] = [{"child": names[c], "background": True} for c in dag.forks[row]]
            if row in dag.spawns:
                turn["spawns"] = [
                    {"children": [names[c] for c in kids], "join_at": join_at}
                    for join_at, kids in sorted(dag.spawns[row].items())
                ]
            turns.append(turn)
        yield {"session_id": names[n], "turns": turns}
