"""Where each recorded prefix block sits in an exact prompt's token positions, and so how many
tokens two requests share.

The trace hashes blocks of its block size in units (characters, or tokens of the proxy's
rendering); the target counts its own tokens. A block's width in tokens is its block size at the
tokens-per-unit ratio of the first request that had it (that prompt's input tokens over its
units), so every request that holds a block puts it at the same positions, and a prompt whose text
is denser in tokens than the trace's average gets its shared prefix as long as it was.

Prompts recorded from text (the proxy) share more than their full blocks: two prompts that agree
for k blocks still agree for part of block k (a shared system prompt ends somewhere inside it),
half a block on average, and the prefix cache reuses that part too. So block k's words start that
far into it: those before are the words of the shared block k - 1, which siblings hold alike, and
the branch word that makes siblings differ (replay.layout) sits where they diverge.
"""

from __future__ import annotations

import numpy as np

from replayproxy.trace import Columns

RECORDED_SHARE = 0.5  # of the first unshared block, what two recorded prompts still share on average
_UNKNOWN_RATIO = 0.25  # tokens per character when the trace has no request with both counts


def ratios(cols: Columns, rows: np.ndarray) -> tuple[np.ndarray, float]:
    """Tokens per prefix unit of each request at `rows`, and of the whole trace (for those without
    both counts). Token-unit traces count the target's tokens one to one."""
    if cols.headers[0].block_unit == "token":
        return np.ones(len(rows)), 1.0
    tokens = cols.input_tokens.astype(np.float64)
    units = cols.prefix_units.astype(np.float64)
    known = (tokens > 0) & (units > 0)
    average = float(tokens[known].sum() / units[known].sum()) if known.any() else _UNKNOWN_RATIO
    mine = known[rows]
    out = np.full(len(rows), average)
    out[mine] = tokens[rows][mine] / units[rows][mine]
    return out, average


def bounds(cols: Columns, rows: np.ndarray, index: np.ndarray, owners: np.ndarray) -> np.ndarray:
    """Per request (`index` over its recorded blocks, `owners`: the position of each block's first
    holder, in `rows` order), where each block's words start and then where its own tail starts:
    len(blocks) + 1 positions, the first 0, flat in the layout of `_branch_words`."""
    size = cols.headers[0].block_size
    per_request, average = ratios(cols, rows)
    widths = np.maximum(size * per_request[owners], 1.0) if len(owners) else np.zeros(0)
    share = RECORDED_SHARE if cols.headers[0].source == "proxy" else 0.0
    lengths = np.diff(index)
    ends = np.cumsum(widths)
    before = np.concatenate([[0.0], ends])[index[:-1]]
    ends -= np.repeat(before, lengths)  # each request's running end of its blocks
    counts = lengths + 1
    out_index = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    out = np.zeros(int(out_index[-1]), np.int64)
    at = np.arange(len(widths)) - np.repeat(index[:-1], lengths) + np.repeat(out_index[:-1], lengths) + 1
    out[at] = np.floor(ends + share * size * average + 0.5).astype(np.int64)
    return out
