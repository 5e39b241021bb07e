"""Recorded prefix hashes re-blocked into the integer `hash_ids` that Mooncake-style consumers read.

Target block j of a request covers tokens [jB, (j+1)B). It gets a *shared* id when it is full and
the recorded chain covers it: its identity is the recorded chain hash of the recorded block holding
its last token (with j mixed in when several target blocks can end in one recorded block). Chained
hashes make that exact when the recorded unit is tokens and B is a multiple of the recorded block
size; otherwise equal ids still imply equal recorded prefixes (never invented sharing), and some
real sharing inside a recorded block is not shown. Every other
block — beyond the hashed prefix, or the trailing partial block — gets a fresh id used once, so no
id ever stands for two block lengths (AIPerf rejects that). Distinct identities become consecutive
integers in first-seen order, as the published traces are. docs/formats.md has the details.
"""

from __future__ import annotations

import numpy as np

from replayproxy.trace import Columns


def source_blocks(cols: Columns) -> tuple[int, str]:
    """The one block size and unit of all loaded files (ids from different blockings cannot match)."""
    kinds = {(h.block_size, h.block_unit) for h in cols.headers}
    if len(kinds) != 1:
        raise ValueError(
            f"traces hashed with different block sizes/units {sorted(kinds)}; export them separately"
        )
    return kinds.pop()


def input_tokens_of(cols: Columns) -> np.ndarray:
    """Input tokens, falling back to the hashed prompt length for token-unit traces; unknown → 0."""
    tokens = cols.input_tokens.astype(np.int64)
    _, unit = source_blocks(cols)
    if unit == "token":
        tokens = np.where(tokens < 0, cols.prefix_units, tokens)
    return np.maximum(tokens, 0)


def block_ids(cols: Columns, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request `ceil(input_tokens / block_tokens)` ids; returns the flat ids and per-request counts."""
    if block_tokens <= 0:
        raise ValueError(f"--block-size must be positive, got {block_tokens}")
    size, unit = source_blocks(cols)
    tokens = input_tokens_of(cols)
    counts = -(-tokens // block_tokens)
    row = np.repeat(np.arange(len(tokens)), counts)
    j = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
    end = (j + 1) * block_tokens  # one past the block's last token
    recorded = np.diff(cols.prefix_index)
    if unit == "token":
        holder = (end + size - 1) // size - 1  # recorded block holding the target block's last token
        shared = (end <= tokens[row]) & (holder < recorded[row])
    else:  # char blocks: tokens per char from the request's own counts
        units = cols.prefix_units.astype(np.float64)
        per_unit = np.where(units > 0, tokens / np.maximum(units, 1), 0.0)
        span = np.maximum(size * per_unit[row], 1e-9)
        holder = np.ceil(end / span - 1e-9).astype(np.int64) - 1
        shared = (end <= tokens[row]) & (holder < recorded[row]) & (per_unit[row] > 0)
    where = np.flatnonzero(shared)
    identity = cols.prefix_hashes[cols.prefix_index[row[where]] + holder[where]]
    if unit != "token" or block_tokens % size:
        # Several target blocks can end in one recorded block: the position joins the key.
        identity = _mix(identity ^ (j[where].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    return _first_seen_ids(len(row), where, identity), counts


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def _first_seen_ids(total: int, where: np.ndarray, identity: np.ndarray) -> np.ndarray:
    """Consecutive ints in order of first appearance; blocks at `where` with equal identity share one."""
    label = np.arange(total, dtype=np.int64)  # blocks not at `where` are their own group
    if len(where):
        order = np.argsort(identity)
        keys = identity[order]
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        first = np.minimum.reduceat(where[order], starts)  # first flat position of each identity
        label[where[order]] = np.repeat(first, np.diff(np.append(starts, len(order))))
    is_first = label == np.arange(total)
    dense = np.cumsum(is_first) - 1
    return dense[label]
