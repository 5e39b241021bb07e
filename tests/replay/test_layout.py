"""Word choice of exact prompts: the vectorized `word_indices` against its rule, position by position."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replayproxy.replay import layout, prompt_parts
from replayproxy.replay.synth import _GOLDEN, _M1, _M2

_MASK = (1 << 64) - 1
SEED = np.uint64(0x1234_5678_9ABC_DEF0)


def _mix(x: int) -> int:
    z = (x + int(_GOLDEN)) & _MASK
    z = ((z ^ (z >> 30)) * int(_M1)) & _MASK
    z = ((z ^ (z >> 27)) * int(_M2)) & _MASK
    return z ^ (z >> 31)


def _reference(
    plan: layout.TokenLayout, hashes: list[int], own: int, branch: list[int], marks: list[int], size: int
) -> list[int]:
    """The layout module's rule, read literally: inside recorded block b, [marks[b], marks[b + 1]),
    the word comes from (h_b, position in block), past the blocks from (own key, position); then
    block b's branch word replaces the first content word at or after marks[b] when it is still
    inside block b (the tail, b == len(hashes), has no end)."""
    content = [p for s, n in zip(plan.starts, plan.lengths, strict=True) for p in range(s, s + n)]
    recorded = marks[len(hashes)]
    words = {}
    for p in content:
        if p < recorded:
            b = max(i for i in range(len(hashes)) if marks[i] <= p)
            key, within = hashes[b], p - marks[b]
        else:
            key, within = own, p
        words[p] = _mix(_mix(within ^ int(SEED)) ^ key) % size
    for b in range(len(hashes) + 1):
        first = next((p for p in content if p >= marks[b]), None)
        if first is not None and (b == len(hashes) or first < marks[b + 1]):
            words[first] = branch[b]
    return [words[p] for p in content]


@st.composite
def cases(draw: st.DrawFn) -> tuple[layout.TokenLayout, list[int], int, list[int], list[int], int, int]:
    block = draw(st.sampled_from([1, 3, 16, 64]))
    lengths = draw(st.lists(st.integers(1, 90), min_size=1, max_size=5))
    head = draw(st.integers(0, 5))
    between = tuple((7,) * draw(st.integers(0, 6)) for _ in lengths[1:])
    closing = (9,) * draw(st.integers(0, 4))
    structure = prompt_parts.Structure((5,) * head, between, closing)
    starts, at = [], head
    for m, length in enumerate(lengths):
        starts.append(at)
        at += length + (len(between[m]) if m < len(between) else 0)
    roles = tuple("u" * len(lengths))
    plan = layout.TokenLayout(roles, tuple(lengths), tuple(starts), at + len(closing), structure)
    end = plan.end(len(lengths) - 1)
    n_hashes = draw(st.integers(0, -(-end // block) + 2))  # fewer, as many, or more blocks than the prompt
    hashes = draw(st.lists(st.integers(0, _MASK), min_size=n_hashes, max_size=n_hashes))
    size = draw(st.integers(2, 300))
    branch = draw(st.lists(st.integers(0, size - 1), min_size=n_hashes + 1, max_size=n_hashes + 1))
    # Blocks of `block` tokens, or of widths around it with the first shifted (block_bounds).
    widths = draw(st.lists(st.integers(1, 2 * block), min_size=n_hashes, max_size=n_hashes))
    uneven = draw(st.booleans())
    marks = [0] + [sum(widths[: i + 1]) + (block // 2 if uneven else 0) for i in range(n_hashes)]
    if not uneven:
        marks = [i * block for i in range(n_hashes + 1)]
    first = draw(st.integers(0, n_hashes))  # the words before this block's start are known
    return plan, hashes, draw(st.integers(0, _MASK)), branch, marks, size, first


@settings(max_examples=400, deadline=None)
@given(cases())
def test_word_indices_follow_the_rule_at_every_content_position(
    case: tuple[layout.TokenLayout, list[int], int, list[int], list[int], int, int],
) -> None:
    """From position 0, and from a block's start inside the recorded blocks (what a known prefix leaves)."""
    plan, hashes, own, branch, marks, size, first = case
    codes = layout.PositionCodes(SEED)
    args = (np.array(hashes, np.uint64), np.uint64(own), np.array(branch, np.int64), marks, codes, size)
    content = [p for s, n in zip(plan.starts, plan.lengths, strict=True) for p in range(s, s + n)]
    expected = dict(zip(content, _reference(plan, hashes, own, branch, marks, size), strict=True))
    chosen = layout.word_indices(plan, *args)
    assert [int(chosen[p]) for p in content] == [expected[p] for p in content]
    start = marks[first]
    later = layout.word_indices(plan, *args, first=first)
    assert [int(later[p - start]) for p in content if p >= start] == [
        expected[p] for p in content if p >= start
    ]
