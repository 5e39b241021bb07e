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

from replayproxy.replay import (
    block_bounds,
    continuations,
    flavors,
    layout,
    prefix_words,
    prompt_parts,
    synth,
    turns,
)
from replayproxy.replay.prepared import Prepared, Schedule
from replayproxy.replay.schedule import scheduled_ns
from replayproxy.shape import ENDPOINT_PATHS
from replayproxy.trace import Columns, ragged_rows

PATHS = {e: ENDPOINT_PATHS[e] for e in ("chat", "completions")}  # the endpoints a trace is replayed on
DEFAULT_INPUT_TOKENS = 128
DEFAULT_OUTPUT_TOKENS = 256
_TOKEN_ID_PROMPT = prompt_parts.Structure((), (), ())  # token ids need no special tokens around them
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
    book: prompt_parts.Book | None = None  # the target's tokenizer measured: exact lengths and sharing
    closed_loop: bool = False  # later turns wait for the turns they continue (replay.continuations)
    live_replies: bool = False  # ...and carry the candidate's replies to them


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


def schedule(cols: Columns, rows: np.ndarray, speed: float) -> Schedule:
    """The schedule of the replayable requests among `rows` (arrival order)."""
    rows = rows[replayable(cols)[rows]] if len(rows) else rows
    links = turns.links(cols, rows, speed)
    first = turns.first_turns(rows, links.after, links.joins, links.join_index)
    times = scheduled_ns(cols.offset_ns[rows], speed)
    return Schedule(
        rows.astype(np.int64), times, links.after, links.think_ns, first, links.joins, links.join_index
    )


class Planner:
    """Plans and serializes the requests at `rows` one at a time, in arrival order.

    Everything that needs the whole selection (schedule, session links, which earlier request
    each prefix copies) is computed once, vectorized, when the planner is made; `next` then
    builds one request. Only the layouts that a later request still copies are kept, so memory
    stays bounded by the live prefix donors, not by the trace. `prepare` and a streamed
    preparation walk the same planner, so their bodies are byte-identical.
    """

    def __init__(
        self,
        cols: Columns,
        rows: np.ndarray,
        flavor: flavors.Flavor,
        options: PlanOptions,
        planned: Schedule | None = None,
    ) -> None:
        """`planned`: the schedule of these rows when already computed (`schedule(cols, rows, speed)`)."""
        self.schedule = planned if planned is not None else schedule(cols, rows, options.speed)
        rows = self.schedule.trace_index
        self.cols, self.rows, self.flavor, self.options = cols, rows, flavor, options
        self._sub_hashes, self._sub_index = ragged_rows(cols.prefix_hashes, cols.prefix_index, rows)
        lengths = np.diff(self._sub_index)
        # Donors are looked up per endpoint: a chat prompt cannot copy a completion's message layout.
        salts = np.array([_ENDPOINT_SALT[str(e)] for e in cols.endpoint[rows]], np.uint64)
        self._salted = self._sub_hashes ^ np.repeat(salts, lengths)
        owners = synth.first_owners(self._salted, self._sub_index)
        self._shared, self._donor = _donors(owners, self._sub_index)
        self._last_use = np.full(len(rows), -1, np.int64)
        copied = self._donor >= 0
        np.maximum.at(self._last_use, self._donor[copied], np.flatnonzero(copied))
        self._block = block_tokens(cols)
        self._words = synth.Words(options.seed, self._block)
        book = options.book
        self._spelled = _Spelled(book.alphabet, self._words, rows) if book is not None else None
        self._ranks: np.ndarray | None = None
        self._rank_index: np.ndarray | None = None
        self._marks: np.ndarray | None = None  # where each block's words start (block_bounds), as _ranks
        if self._spelled is not None:
            size = len(self._spelled.words)
            self._ranks, self._rank_index = _branch_words(self._salted, self._sub_index, salts, rows, size)
            self._marks = block_bounds.bounds(cols, rows, self._sub_index, owners)
        self._layouts: dict[int, synth.Layout | layout.TokenLayout | None] = {}
        self._sessions: continuations.Continuations | None = None
        if options.closed_loop:
            self._sessions = continuations.Continuations(
                cols, rows, self.schedule.after, options.speed, live=options.live_replies,
                token_ids=flavor.name in continuations.TOKEN_ID_FLAVORS,
            )  # fmt: skip
        self.position = 0

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Prepared]:
        while self.position < len(self.rows):
            prepared = self.next()
            assert prepared is not None
            yield prepared

    def next(self, render: bool = True) -> Prepared | None:
        """The request at `position` (then the next one); None when not `render`ed, which still
        plans what a later request copies from it."""
        position = self.position
        self.position += 1
        cols, options, flavor, block = self.cols, self.options, self.flavor, self._block
        row = int(self.rows[position])
        shared = int(self._shared[position])
        donor_at = int(self._donor[position])
        donor = self._layouts.get(donor_at) if donor_at >= 0 else None
        if donor_at >= 0 and self._last_use[donor_at] == position:
            self._layouts.pop(donor_at, None)
        keep = self._last_use[position] > position
        if not render and not keep:
            return None
        span = slice(int(self._sub_index[position]), int(self._sub_index[position + 1]))
        recorded_in = int(cols.input_tokens[row])
        expected_shared = min(shared * block, max(recorded_in, 0))
        exact_plan = None
        spelled, ranks, rank_index, marks = self._spelled, self._ranks, self._rank_index, self._marks
        if options.book is not None and ranks is not None and rank_index is not None and spelled is not None:
            assert marks is not None
            own = slice(int(rank_index[position]), int(rank_index[position + 1]))
            exact_plan = _plan_exact(
                cols, row, self._salted[span], shared,
                donor if isinstance(donor, layout.TokenLayout) else None, ranks[own], marks[own].tolist(),
                position, options, options.book, spelled, flavor.token_id_prompts, render,
            )  # fmt: skip
        plan_layout: synth.Layout | layout.TokenLayout
        if exact_plan is not None:
            planned, plan_layout, key, expected_in, planned_shared, expected_shared = exact_plan
        else:
            planned, plan_layout, key, expected_in = _plan_one(
                cols, row, self._sub_hashes[span], shared, donor if isinstance(donor, synth.Layout) else None,
                self._words, options, flavor.token_id_prompts, render,
            )  # fmt: skip
            planned_shared = -1
        if keep:
            copyable = planned.endpoint == "chat" or exact_plan is not None
            self._layouts[position] = plan_layout if copyable else None
        if not render:
            return None
        body = flavors.request_body(flavor, planned)
        sessions = self._sessions
        if sessions is not None and sessions.asks_ids(position):
            body["return_token_ids"] = True
        prepared = Prepared(
            index=row,
            scheduled_ns=int(self.schedule.scheduled_ns[position]),
            endpoint=planned.endpoint,
            path=PATHS[planned.endpoint],
            body=orjson.dumps(body),
            stream=planned.stream,
            expected_input_tokens=expected_in,
            expected_output_tokens=planned.max_tokens if int(cols.output_tokens[row]) >= 0 else -1,
            template_key=key,
            expected_shared_tokens=expected_shared,
            planned_shared_tokens=planned_shared,
            exact=exact_plan is not None,
            session=int(cols.session[row]),
            turn=int(cols.turn[row]),
            after=int(self.schedule.after[position]),
            think_ns=int(self.schedule.think_ns[position]),
            first=int(self.schedule.first[position]),
            joins=(joins := self.schedule.joins_of(position)),
            join_slots=_join_slots(cols, row, int(self.schedule.after[position]), len(joins)),
            spawned=bool(cols.spawned[row]),
        )
        if sessions is None:
            return prepared
        return sessions.rewrite(prepared, planned.prompt if planned.endpoint == "chat" else None)


def prepare(cols: Columns, rows: np.ndarray, flavor: flavors.Flavor, options: PlanOptions) -> list[Prepared]:
    """Plan and serialize the requests at `rows` (arrival order) all at once, each later turn of a
    session naming the turn before it (`after`), which a closed-loop run waits for."""
    return list(iter_prepared(cols, rows, flavor, options))


def iter_prepared(
    cols: Columns, rows: np.ndarray, flavor: flavors.Flavor, options: PlanOptions
) -> Iterator[Prepared]:
    """`prepare` one request at a time: a caller that writes each body out (an export of millions
    of prompts) never holds them all."""
    return iter(Planner(cols, rows, flavor, options))


def _join_slots(cols: Columns, row: int, parent: int, count: int) -> tuple[int, ...]:
    """Where a join's recorded context held the replies it joins, by message index: its first
    `count` assistant and tool messages after its parent's reply (the proxy links a join by those;
    the plan sends tool results as user messages, so the roles alone no longer say it)."""
    if not count or parent < 0:
        return ()
    roles = str(cols.roles[row])
    after_reply = len(str(cols.roles[parent])) + 1
    return tuple(i for i in range(after_reply, len(roles)) if roles[i] in "at")[:count]


def _donors(owners: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per request, its leading blocks that an earlier request had (chains are prefix-closed) and
    the position of the request it copies them from (first owner of its deepest shared block; -1: none)."""
    count = len(index) - 1
    own = np.repeat(np.arange(count, dtype=np.int64), np.diff(index))
    earlier = np.concatenate([[0], np.cumsum(owners < own)])
    shared = (earlier[index[1:]] - earlier[index[:-1]]).astype(np.int64)
    donor = np.full(count, -1, np.int64)
    has = shared > 0
    donor[has] = owners[index[:-1][has] + shared[has] - 1]
    return shared, donor


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
    prefixes: prefix_words.PrefixWords  # words of prefixes that recur

    def __init__(self, letters: prompt_parts.Alphabet, words: synth.Words, rows: np.ndarray) -> None:
        object.__setattr__(self, "words", np.array(letters.words, dtype=object))
        object.__setattr__(self, "ids", np.array(letters.ids, dtype=np.int64))
        object.__setattr__(self, "codes", layout.PositionCodes(words._seed))
        object.__setattr__(self, "tails", layout.tail_keys(rows))
        object.__setattr__(self, "prefixes", prefix_words.PrefixWords())


def _plan_exact(
    cols: Columns,
    row: int,
    salted: np.ndarray,
    shared: int,
    donor: layout.TokenLayout | None,
    branch: np.ndarray,
    marks: list[int],
    position: int,
    options: PlanOptions,
    book: prompt_parts.Book,
    spelled: _Spelled,
    token_ids: bool,
    render: bool = True,
) -> tuple[flavors.Planned, layout.TokenLayout, str, int, int, int] | None:
    """One request built from the measured alphabet and template, sharing its first `shared` blocks
    (up to marks[shared] tokens, block_bounds); None when its template is unknown. Without
    `render` only the layout is made (the prompt is left empty). Returns the planned request, its
    layout, template key, expected input tokens, tokens shared with the donor as planned and as the
    trace implies."""
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
        structure = _TOKEN_ID_PROMPT if token_ids else book.text
    token_ids = token_ids and endpoint != "chat"
    n_tokens = max(n_tokens, structure.overhead + len(roles))
    shared_tokens = marks[shared]
    plan, realized = layout.shared_layout(roles, structure, n_tokens, marks, shared_tokens, donor)
    if plan is None:
        return None
    implied = min(shared_tokens, max(recorded_in, 0))
    if not render:
        expected = plan.total if recorded_in > 0 else -1
        return _planned(cols, row, endpoint, None, options), plan, key, expected, realized, implied
    contents = _contents(plan, salted, branch, marks, position, shared, spelled, token_ids)
    prompt: Any
    if endpoint == "chat":
        prompt = [{"role": role, "content": text} for role, text in zip(roles, contents, strict=True)]
    else:
        prompt = contents[0]
    planned = _planned(cols, row, endpoint, prompt, options)
    return planned, plan, key, plan.total if recorded_in > 0 else -1, realized, implied


def _contents(
    plan: layout.TokenLayout,
    salted: np.ndarray,
    branch: np.ndarray,
    marks: list[int],
    position: int,
    shared: int,
    spelled: _Spelled,
    token_ids: bool,
) -> list[Any]:
    """Each message's words (text, or token ids); those before the first `shared` blocks' end (a
    prefix an earlier request had) copied from `spelled.prefixes` when kept there, else kept there."""
    shared_tokens = marks[shared]
    known = shared_tokens >= prefix_words.MIN_TOKENS
    at = prefix_words.key(plan, salted, branch, shared, shared_tokens, token_ids) if known else None
    kept = spelled.prefixes.get(at) if at is not None else None
    first = shared if kept is not None else 0
    start = marks[first]
    chosen = layout.word_indices(
        plan, salted, spelled.tails[position], branch, marks, spelled.codes, len(spelled.words), first
    )

    def words(low: int, high: int) -> Any:
        picked = chosen[low - start : high - start]
        return spelled.ids[picked].tolist() if token_ids else " ".join(spelled.words[picked].tolist())

    contents: list[Any] = []
    heads: list[Any] = []
    for m, (begin, length) in enumerate(zip(plan.starts, plan.lengths, strict=True)):
        end = begin + length
        if at is None or begin >= shared_tokens:
            contents.append(words(begin, end))
            continue
        cut = min(end, shared_tokens)
        head = kept[m] if kept is not None else words(begin, cut)
        heads.append(head)
        if end == cut:
            contents.append(list(head) if token_ids else head)  # a kept list is never handed out
        else:
            rest = words(cut, end)
            contents.append(head + rest if token_ids else f"{head} {rest}")
    if at is not None and kept is None:
        spelled.prefixes.put(at, tuple(heads))
    return contents


def _plan_one(
    cols: Columns,
    row: int,
    hashes: np.ndarray,
    shared: int,
    donor: synth.Layout | None,
    words: synth.Words,
    options: PlanOptions,
    token_ids: bool,
    render: bool = True,
) -> tuple[flavors.Planned, synth.Layout, str, int]:
    """One request from calibrated words; without `render` only its layout (the prompt left empty)."""
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
        prompt: Any = None
        if render:
            spans = plan.spans()
            counts = [(start, _word_count(tokens, template)) for _, start, tokens in spans]
            texts = words.texts(row, hashes, counts)
            prompt = [{"role": s[0], "content": text} for s, text in zip(spans, texts, strict=True)]
    else:
        overhead = 0 if token_ids else options.text_template.overhead("completions", 1)
        plan = synth.Layout((("prompt", max(1, n_tokens - overhead)),), 0)
        tokens = plan.messages[0][1]
        if not render:
            prompt = None
        elif token_ids:
            prompt = words.token_ids(row, hashes, tokens)
        else:
            prompt = _text(words, row, hashes, 0, tokens, options.text_template)
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


def _word_count(tokens: int, template: synth.Template) -> int:
    count = round(tokens / template.tokens_per_word) if template.tokens_per_word > 0 else tokens
    return max(0, count)


def _text(
    words: synth.Words, row: int, hashes: np.ndarray, start: int, tokens: int, template: synth.Template
) -> str:
    return words.words(row, hashes, start, _word_count(tokens, template))
