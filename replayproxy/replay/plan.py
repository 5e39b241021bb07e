"""From trace columns to ready-to-send requests: lengths, prompts, engine dialect, JSON bytes.

Runs before the clock starts (schedule -> synth -> flavors), walking the selected requests in
arrival order so prefix donors are planned before the requests that copy them. Same columns,
options and template give byte-identical bodies.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from replayproxy.replay import exact, flavors, layout, synth, turns
from replayproxy.replay.schedule import scheduled_ns
from replayproxy.shape import ENDPOINT_PATHS
from replayproxy.trace import Columns

PATHS = {e: ENDPOINT_PATHS[e] for e in ("chat", "completions")}  # the endpoints a trace is replayed on
DEFAULT_INPUT_TOKENS = 128
DEFAULT_OUTPUT_TOKENS = 256
_ENDPOINT_SALT = {"chat": 0, "completions": 0x5A17_C0DE_5A17_C0DE}


@dataclass(frozen=True, slots=True)
class PlanOptions:
    seed: int = 0
    speed: float = 1.0
    model: str | None = None  # send every request to this model
    model_map: dict[str, str] = field(default_factory=dict)  # recorded name -> target name
    default_model: str = ""  # for requests without a recorded model (the target's first model)
    chat_template: synth.Template = field(default_factory=synth.Template)
    text_template: synth.Template = field(default_factory=lambda: synth.Template(fixed_tokens=1))
    book: exact.Book | None = None  # the target's tokenizer measured: exact lengths and sharing


@dataclass(frozen=True, slots=True)
class Prepared:
    """One request, fully serialized; `scheduled_ns` is relative to the run start."""

    index: int  # row in the arrival-sorted trace
    scheduled_ns: int
    endpoint: str
    path: str
    body: bytes
    stream: bool
    expected_input_tokens: int
    expected_output_tokens: int
    template_key: str = ""  # chat calibration key ("" for completions)
    expected_shared_tokens: int = 0  # prefix tokens an earlier request had, as the trace says
    planned_shared_tokens: int = 0  # prefix tokens the bodies share with the donor's (-1: approximate)
    exact: bool = False  # built through the target's tokenizer: length and sharing are exact
    session: int = 0  # the trace's session id; 0 outside sessions
    turn: int = 0
    after: int = turns.NONE  # trace index of the session's previous selected turn (closed loop waits for it)
    think_ns: int = turns.NONE  # wait after that turn's end (ns, at the run's speed)
    first: int = turns.NONE  # trace index of the session's first replayed turn (sessions stay together)

    @property
    def group(self) -> int:
        """What keeps a session on one worker or shard: its first turn's index, else its own."""
        return self.first if self.first >= 0 else self.index


def block_tokens(cols: Columns) -> int:
    """The trace's prefix block size in tokens; char blocks are converted with the trace's ratio."""
    header = cols.headers[0]
    if header.block_unit == "token":
        return max(1, header.block_size)
    known = (cols.input_tokens > 0) & (cols.prefix_units > 0)
    ratio = float(cols.input_tokens[known].sum() / cols.prefix_units[known].sum()) if known.any() else 0.25
    return max(1, round(header.block_size * ratio))


def replayable(cols: Columns) -> np.ndarray:
    """Rows the replayer can send (chat and completions; embeddings and others are skipped)."""
    return np.isin(cols.endpoint, list(PATHS))


def model_for(recorded: str, options: PlanOptions) -> str:
    if options.model:
        return options.model
    return options.model_map.get(recorded, recorded) or options.default_model


def prepare(cols: Columns, rows: np.ndarray, flavor: flavors.Flavor, options: PlanOptions) -> list[Prepared]:
    """Plan and serialize the requests at `rows` (arrival order), each later turn of a session
    naming the turn before it (`after`), which a closed-loop run waits for."""
    return list(iter_prepared(cols, rows, flavor, options))


def iter_prepared(
    cols: Columns, rows: np.ndarray, flavor: flavors.Flavor, options: PlanOptions
) -> Iterator[Prepared]:
    """`prepare` one request at a time: a caller that writes each body out (an export of millions
    of prompts) never holds them all."""
    rows = rows[replayable(cols)[rows]] if len(rows) else rows
    times = scheduled_ns(cols.offset_ns[rows], options.speed)
    links = turns.links(cols, rows, options.speed)
    firsts = turns.first_turns(rows, links.after)
    sub_index = np.concatenate([[0], np.cumsum(np.diff(cols.prefix_index)[rows])]).astype(np.int64)
    sub_hashes = cols.prefix_hashes[
        np.arange(int(sub_index[-1]))
        + np.repeat(cols.prefix_index[rows] - sub_index[:-1], np.diff(sub_index))
    ]
    # Donors are looked up per endpoint: a chat prompt cannot copy a completion's message layout.
    salts = np.array([_ENDPOINT_SALT[str(e)] for e in cols.endpoint[rows]], np.uint64)
    owners = synth.first_owners(sub_hashes ^ np.repeat(salts, np.diff(sub_index)), sub_index)
    block = block_tokens(cols)
    words = synth.Words(options.seed, block)
    salted = sub_hashes ^ np.repeat(salts, np.diff(sub_index))
    spelled = _Spelled(options.book.alphabet, words, rows) if options.book else None
    size = len(spelled.words) if spelled is not None else 1
    ranks, rank_index = _branch_words(salted, sub_index, salts, rows, size) if options.book else (None, None)
    layouts: list[synth.Layout | layout.Layout | None] = []
    for position, row in enumerate(rows.tolist()):
        hashes = sub_hashes[sub_index[position] : sub_index[position + 1]]
        shared = synth.shared_blocks(owners, sub_index, position)
        donor = layouts[int(owners[sub_index[position] + shared - 1])] if shared else None
        recorded_in = int(cols.input_tokens[row])
        expected_shared = min(shared * block, max(recorded_in, 0))
        exact_plan = None
        if options.book is not None and ranks is not None and rank_index is not None and spelled is not None:
            exact_plan = _plan_exact(
                cols, row, salted[sub_index[position] : sub_index[position + 1]], shared * block,
                donor if isinstance(donor, layout.Layout) else None,
                ranks[rank_index[position] : rank_index[position + 1]], position, options,
                options.book, spelled, flavor.token_id_prompts, block,
            )  # fmt: skip
        plan_layout: synth.Layout | layout.Layout
        if exact_plan is not None:
            planned, plan_layout, key, expected_in, planned_shared = exact_plan
        else:
            planned, plan_layout, key, expected_in = _plan_one(
                cols, row, hashes, shared, donor if isinstance(donor, synth.Layout) else None, words, options,
                flavor.token_id_prompts,
            )  # fmt: skip
            planned_shared = -1
        layouts.append(plan_layout if planned.endpoint == "chat" or exact_plan is not None else None)
        body = orjson.dumps(flavors.request_body(flavor, planned))
        yield Prepared(
            index=row,
            scheduled_ns=int(times[position]),
            endpoint=planned.endpoint,
            path=PATHS[planned.endpoint],
            body=body,
            stream=planned.stream,
            expected_input_tokens=expected_in,
            expected_output_tokens=planned.max_tokens if int(cols.output_tokens[row]) >= 0 else -1,
            template_key=key,
            expected_shared_tokens=expected_shared,
            planned_shared_tokens=planned_shared,
            exact=exact_plan is not None,
            session=int(cols.session[row]),
            turn=int(cols.turn[row]),
            after=int(links.after[position]),
            think_ns=int(links.think_ns[position]),
            first=int(firsts[position]),
        )


def _branch_words(
    salted: np.ndarray, sub_index: np.ndarray, salts: np.ndarray, rows: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Branch words of every request's recorded blocks and tail (layout.branch_ranks), flat + index."""
    counts = np.diff(sub_index) + 1
    index = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    parents = np.empty(int(index[-1]), np.uint64)
    children = np.empty(int(index[-1]), np.uint64)
    lengths = np.diff(sub_index)
    at = np.arange(len(salted)) - np.repeat(sub_index[:-1], lengths) + np.repeat(index[:-1], lengths)
    parents[index[:-1]] = salts
    parents[at + 1] = salted
    children[at] = salted
    children[index[1:] - 1] = layout.tail_keys(rows)
    return layout.branch_words(parents, layout.branch_ranks(parents, children), size), index


@dataclass(frozen=True, slots=True)
class _Spelled:
    """The alphabet as arrays, and the word seed, made once per preparation."""

    words: np.ndarray  # object: the words
    ids: np.ndarray  # int64: their ids after a space
    codes: layout.PositionCodes
    tails: np.ndarray  # uint64: each planned request's own key

    def __init__(self, letters: exact.Alphabet, words: synth.Words, rows: np.ndarray) -> None:
        object.__setattr__(self, "words", np.array(letters.words, dtype=object))
        object.__setattr__(self, "ids", np.array(letters.ids, dtype=np.int64))
        object.__setattr__(self, "codes", layout.PositionCodes(words._seed))
        object.__setattr__(self, "tails", layout.tail_keys(rows))


def _plan_exact(
    cols: Columns,
    row: int,
    salted: np.ndarray,
    shared_tokens: int,
    donor: layout.Layout | None,
    branch: np.ndarray,
    position: int,
    options: PlanOptions,
    book: exact.Book,
    spelled: _Spelled,
    token_ids: bool,
    block: int,
) -> tuple[flavors.Planned, layout.Layout, str, int, int] | None:
    """One request built from the measured alphabet and template; None when its template is unknown."""
    endpoint = str(cols.endpoint[row])
    recorded_in = int(cols.input_tokens[row])
    n_tokens = recorded_in if recorded_in > 0 else DEFAULT_INPUT_TOKENS
    tools = bool(cols.has_tools[row])
    key = ""
    if endpoint == "chat":
        roles = synth.chat_roles(str(cols.roles[row]))
        key = synth.template_key(roles, tools)
        structure = book.chat.get(key)
        if structure is None:
            return None
    else:
        roles = ("prompt",)
        structure = exact.Structure((), (), ()) if token_ids else book.text
    token_ids = token_ids and endpoint != "chat"
    n_tokens = max(n_tokens, structure.overhead + len(roles))
    plan, shared = layout.shared_layout(roles, structure, n_tokens, block, shared_tokens, donor)
    if plan is None:
        return None
    chosen = layout.word_indices(
        plan.positions(), salted, spelled.tails[position], branch, block, spelled.codes, len(spelled.words)
    )
    contents: list[Any] = []
    at = 0
    for length in plan.lengths:
        picked = chosen[at : at + length]
        at += length
        if token_ids:
            contents.append(spelled.ids[picked].tolist())
        else:
            contents.append(" ".join(spelled.words[picked].tolist()))
    prompt: Any
    if endpoint == "chat":
        prompt = [{"role": role, "content": text} for role, text in zip(roles, contents, strict=True)]
    else:
        prompt = contents[0]
    planned = _planned(cols, row, endpoint, prompt, options)
    return planned, plan, key, plan.total if recorded_in > 0 else -1, shared


def _plan_one(
    cols: Columns,
    row: int,
    hashes: np.ndarray,
    shared: int,
    donor: synth.Layout | None,
    words: synth.Words,
    options: PlanOptions,
    token_ids: bool,
) -> tuple[flavors.Planned, synth.Layout, str, int]:
    endpoint = str(cols.endpoint[row])
    recorded_in = int(cols.input_tokens[row])
    n_tokens = recorded_in if recorded_in > 0 else DEFAULT_INPUT_TOKENS
    shared_tokens = shared * words.block_tokens
    tools = bool(cols.has_tools[row])
    key = ""
    if endpoint == "chat":
        roles = synth.chat_roles(str(cols.roles[row]))
        key = synth.template_key(roles, tools)
        template = options.chat_template
        overhead = template.overhead(key, len(roles))
        plan = synth.layout(n_tokens, roles, overhead, template.per_message_tokens, shared_tokens, donor)
        prompt: Any = [
            {"role": role, "content": _text(words, row, hashes, start, tokens, template)}
            for role, start, tokens in plan.spans()
        ]
    else:
        overhead = 0 if token_ids else options.text_template.overhead("completions", 1)
        plan = synth.Layout((("prompt", max(1, n_tokens - overhead)),), 0)
        tokens = plan.messages[0][1]
        prompt = (
            words.token_ids(row, hashes, tokens)
            if token_ids
            else _text(words, row, hashes, 0, tokens, options.text_template)
        )
    planned = _planned(cols, row, endpoint, prompt, options)
    return planned, plan, key, recorded_in if recorded_in > 0 else -1


def _planned(cols: Columns, row: int, endpoint: str, prompt: Any, options: PlanOptions) -> flavors.Planned:
    recorded_out = int(cols.output_tokens[row])
    if recorded_out < 0:
        recorded_out = int(cols.max_tokens[row]) if int(cols.max_tokens[row]) > 0 else DEFAULT_OUTPUT_TOKENS
    return flavors.Planned(
        endpoint=endpoint,
        model=model_for(str(cols.model[row]), options),
        prompt=prompt,
        stream=bool(cols.stream[row]),
        max_tokens=max(1, recorded_out),
        sampling=dict(cols.sampling[row] or {}),
        tools=bool(cols.has_tools[row]),
        response_format=bool(cols.has_response_format[row]),
    )


def _text(
    words: synth.Words, row: int, hashes: np.ndarray, start: int, tokens: int, template: synth.Template
) -> str:
    count = round(tokens / template.tokens_per_word) if template.tokens_per_word > 0 else tokens
    return words.words(row, hashes, start, max(0, count))
