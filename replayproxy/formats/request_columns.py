"""The per-request columns (every shape field, one row per request) that the csv and parquet exports write.

The columns (names, types, units) are listed in docs/formats.md; ragged fields stay lists (parquet)
or space-separated numbers (csv) so DuckDB, pandas or Spark can explode them when needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from replayproxy.trace import Columns

# name -> (source field or derivation, type for documentation and parquet)
COLUMNS: dict[str, str] = {
    "offset_ns": "int64",
    "arrival_s": "float64",
    "endpoint": "string",
    "model": "string",
    "method": "string",
    "stream": "bool",
    "input_tokens": "int64",
    "output_tokens": "int64",
    "output_estimated": "bool",
    "max_tokens": "int64",
    "message_count": "int64",
    "roles": "string",
    "has_tools": "bool",
    "has_response_format": "bool",
    "sampling": "string",
    "prefix_units": "int64",
    "prefix_blocks": "int64",
    "prefix_hashes": "list<uint64>",
    "status": "int64",
    "error": "string",
    "ttft_ns": "int64",
    "e2e_ns": "int64",
    "chunk_count": "int64",
    "chunk_gaps_us": "list<uint32>",
    "cached_tokens": "int64",
    "session": "uint64",
    "turn": "int64",
    "request_bytes": "int64",
    "response_bytes": "int64",
    "request_type": "string",
}
RAGGED = {
    "prefix_hashes": ("prefix_hashes", "prefix_index"),
    "chunk_gaps_us": ("chunk_gaps_us", "chunk_index"),
}


def request_columns(cols: Columns, rows: slice, texts: dict[int, str]) -> dict[str, Any]:
    """Column name -> the values of consecutive `rows`: a numpy array (scalars) or a (flat, index)
    pair (ragged; the index starts at 0), in COLUMNS order. `texts` carries the sampling maps
    already written as JSON from one range to the next."""
    first = int(cols.offset_ns[0]) if len(cols) else 0
    prefix_index = cols.prefix_index[rows.start : rows.stop + 1]
    chunk_index = cols.chunk_index[rows.start : rows.stop + 1]
    derived: dict[str, Any] = {
        "arrival_s": (cols.offset_ns[rows].astype(np.int64) - first) / 1e9,
        "message_count": cols.message_counts(rows),
        "sampling": _sampling_texts(cols.sampling[rows], texts),
        "prefix_blocks": np.diff(prefix_index),
        "chunk_count": np.where(cols.ttft_ns[rows] >= 0, np.diff(chunk_index) + 1, 0),
    }
    columns: dict[str, Any] = {}
    for name in COLUMNS:
        if name in RAGGED:
            flat_name, index_name = RAGGED[name]
            index = prefix_index if index_name == "prefix_index" else chunk_index
            flat = getattr(cols, flat_name)[int(index[0]) : int(index[-1])]
            columns[name] = (flat, index - index[0])
        else:
            columns[name] = derived[name] if name in derived else cols.scalar[name][rows]
    return columns


def _sampling_texts(sampling: np.ndarray, texts: dict[int, str]) -> np.ndarray:
    """Each request's sampling map as JSON; rows share the few distinct maps a trace decodes to, so
    each is written once (one string per distinct map, not one per row)."""
    out = np.empty(len(sampling), object)
    for i, value in enumerate(sampling.tolist()):
        text = texts.get(id(value))
        if text is None:
            text = texts[id(value)] = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
        out[i] = text
    return out


def header_note(cols: Columns) -> str:
    """What the prefix columns mean for these files (block size and unit of the hashes)."""
    kinds = sorted({(h.block_size, h.block_unit, h.hash_scheme) for h in cols.headers})
    return "prefix_hashes: " + "; ".join(f"{size}-{unit} blocks, {scheme}" for size, unit, scheme in kinds)
