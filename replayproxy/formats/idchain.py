"""Source hash ids turned into prefix hashes: a chain over each request's ids, computed vectorized.

Importers hand the ids of Mooncake/Bailian/jsonl rows here; the result keeps the trace's meaning
of a prefix hash whatever the source's ids mean (see docs/formats.md, "Import: common rules").
"""

from __future__ import annotations

import numpy as np

# Imported prefix hashes are not keyed blake2b hashes of text: they are a polynomial chain over the
# source's integer ids, so equal hashes still mean "equal ids up to and including this block".
IMPORT_HASH_SCHEME = "poly64-idchain-v1"
_BASE = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2**64
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
_SALT = np.uint64(0x7265706C61797072)  # b"replaypr"


def chain_hashes(
    ids: np.ndarray, counts: np.ndarray, keep: np.ndarray | None = None, chunk: int = 1 << 20
) -> np.ndarray:
    """Per row, h_i = mix(H_i, i) with H_i = H_{i-1}·P + mix(id_i) mod 2**64: a chain over the ids.

    Equal h_i means equal ids at every position up to i (for all but adversarially built
    sequences: polynomial hashes modulo 2**64 can be made to collide by Thue-Morse-like inputs).
    The linear recurrence is computed as a segmented prefix sum, H_i = P^i · Σ_k mix(id_k)·P^-k,
    a few sequential passes over row-aligned chunks of about `chunk` ids (small temporaries are
    reused instead of page-faulting fresh memory on every pass). With `keep`, only each row's
    first keep[row] hashes are returned.
    """
    keep = counts if keep is None else keep
    kept_ends = np.concatenate([[0], np.cumsum(keep)])
    out = np.empty(int(kept_ends[-1]), np.uint64)
    if not len(ids):
        return out
    powers, inverse_powers = _powers(int(counts.max()))
    ends = np.concatenate([[0], np.cumsum(counts)])
    cuts = np.searchsorted(ends, np.arange(chunk, int(ends[-1]), chunk), side="right") - 1  # row boundaries
    bounds = np.unique(np.concatenate([[0], cuts, [len(counts)]])).tolist()
    for first, last in zip(bounds[:-1], bounds[1:], strict=True):
        rows = counts[first:last]
        lo, hi = int(ends[first]), int(ends[last])
        if hi <= lo:
            continue
        starts = np.cumsum(rows) - rows
        position = np.arange(hi - lo, dtype=np.int64) - np.repeat(starts, rows)
        terms = _finalize(ids[lo:hi].astype(np.uint64) ^ _SALT)
        terms *= inverse_powers[position]
        sums = np.cumsum(terms, dtype=np.uint64)
        sums -= np.repeat(np.concatenate([np.zeros(1, np.uint64), sums])[starts], rows)
        sums *= powers[position]
        sums ^= (position.astype(np.uint64) + np.uint64(1)) * _M3
        out[kept_ends[first] : kept_ends[last]] = _finalize(
            sums[position < np.repeat(keep[first:last], rows)]
        )
    return out


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P^j and P^-j modulo 2**64 for j < n."""
    inverse = _BASE
    for _ in range(6):  # Newton's iteration doubles the correct low bits each time: 3 -> 192
        inverse = inverse * (2 - _BASE * inverse) % (1 << 64)
    powers, inverse_powers, p, q = [], [], 1, 1
    for _ in range(n):
        powers.append(p)
        inverse_powers.append(q)
        p, q = p * _BASE % (1 << 64), q * inverse % (1 << 64)
    return np.array(powers, np.uint64), np.array(inverse_powers, np.uint64)


def _finalize(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection on 64 bits that spreads every input bit."""
    z = z ^ (z >> np.uint64(30))
    z *= _M2
    z ^= z >> np.uint64(27)
    z *= _M3
    return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]
