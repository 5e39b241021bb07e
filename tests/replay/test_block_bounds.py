"""Where recorded blocks sit in token positions: per block its first holder's ratio, and for traces
recorded from text half a block more shared; the exact prompts share exactly that."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from replayproxy import trace
from replayproxy.replay import block_bounds, flavors, plan, prompt_parts
from replayproxy.replay.hf_tokenizer import LocalTokenizer
from replayproxy.replay.synth import first_owners
from replayproxy.replay.tokenizer_setup import chat_keys
from replayproxy.shape import RequestShape
from tests.replay import traces
from tests.replay.test_exact import _ids, _longest_shared

MS = 1_000_000


def _first_turns(groups: list[tuple[int, float]], siblings: int, spread: float = 0.0) -> list[RequestShape]:
    """Per group (shared blocks, tokens per character), first turns sharing its system prompt's
    blocks, each with blocks of its own after them and `spread` more tokens per character than
    the one before."""
    shapes, at = [], 0
    for g, (blocks, ratio) in enumerate(groups):
        for s in range(siblings):
            hashes = tuple(1000 * g + b + 1 for b in range(blocks)) + tuple(
                10**6 + 100 * at + b for b in range(3)
            )
            units = 64 * len(hashes) + 40
            shapes.append(
                RequestShape(
                    at * MS,
                    "chat",
                    model=traces.SIM_MODEL,
                    roles="su",
                    input_tokens=round(units * (ratio + s * spread)),
                    output_tokens=4,
                    prefix_units=units,
                    prefix_hashes=hashes,
                    status=200,
                )  # fmt: skip
            )
            at += 1
    return shapes


def _bounds(cols: trace.Columns) -> tuple[np.ndarray, np.ndarray]:
    rows = np.arange(len(cols))
    marks = block_bounds.bounds(
        cols, rows, cols.prefix_index, first_owners(cols.prefix_hashes, cols.prefix_index)
    )
    return marks, np.concatenate([[0], np.cumsum(np.diff(cols.prefix_index) + 1)])


def test_blocks_of_generated_traces_stay_whole_and_even(tmp_path: Path) -> None:
    path = traces.write(tmp_path / "t.rpt", _first_turns([(5, 1.0), (7, 1.0)], 2), block_size=16)
    marks, index = _bounds(trace.load(path))
    for r in range(4):
        assert marks[index[r] : index[r + 1]].tolist() == [16 * b for b in range(index[r + 1] - index[r])]


def test_recorded_text_blocks_take_their_first_holders_ratio_and_half_a_block_more(tmp_path: Path) -> None:
    shapes = _first_turns([(6, 0.25), (6, 0.30)], 2, spread=0.02)
    path = traces.write(tmp_path / "t.rpt", shapes, block_size=64, unit="char", source="proxy")
    cols = trace.load(path)
    marks, index = _bounds(cols)
    average = cols.input_tokens.sum() / cols.prefix_units.sum()
    ratio = cols.input_tokens / cols.prefix_units
    for r in range(4):
        holder = [r - r % 2] * 6 + [r] * 3  # the group's first turn had the shared blocks first
        ends = np.cumsum([64 * ratio[h] for h in holder])
        assert marks[index[r] : index[r + 1]].tolist() == [
            0,
            *np.floor(ends + 32 * average + 0.5).astype(int),
        ]
    # the second of a group starts its own blocks where the first's shared blocks end (half a block on)
    assert marks[index[1] + 6] == marks[index[0] + 6]
    assert marks[index[3] + 6] > marks[index[1] + 6]  # the denser group shares more tokens


def test_exact_prompts_share_what_the_bounds_say(tmp_path: Path, bpe_tokenizer: Path) -> None:
    shapes = _first_turns([(6, 0.24), (9, 0.28), (4, 0.31)], 3)
    path = traces.write(tmp_path / "t.rpt", shapes, block_size=64, unit="char", source="proxy")
    cols = trace.load(path)
    rows = np.arange(len(cols))
    tokenizer = LocalTokenizer(bpe_tokenizer)
    book = asyncio.run(prompt_parts.measure(tokenizer, chat_keys(cols, rows)))
    prepared = plan.prepare(cols, rows, flavors.get("vllm"), plan.PlanOptions(book=book))
    ids = _ids(tokenizer, prepared)
    assert [len(i) for i in ids] == [p.expected_input_tokens for p in prepared]
    marks, index = _bounds(cols)
    shared = _longest_shared(ids, [p.endpoint for p in prepared])
    for r, p in enumerate(prepared):
        if r % 3 == 0:
            continue  # the first of its group
        blocks = len(shapes[r].prefix_hashes) - 3
        assert p.expected_shared_tokens == marks[index[r] + blocks] == shared[r]
        assert p.expected_shared_tokens > round(
            64 * blocks * cols.input_tokens[r - r % 3] / cols.prefix_units[r - r % 3]
        )
