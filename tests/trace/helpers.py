"""Shared by the trace tests: a shape strategy, an injected clock, and files written and read the
way production writes and reads them (TraceWriter, trace.load), plus hand-built frames for the
damaged and foreign files no writer of ours produces."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zstandard
from hypothesis import strategies as st

from replayproxy import trace
from replayproxy.shape import FIELD_KINDS, FIELDS, RequestShape, pack_u32, pack_u64
from replayproxy.trace import TraceHeader, TraceWriter
from replayproxy.trace.column_file import Pieces, encode_column

I64 = st.integers(-(2**63), 2**63 - 1)
U64 = st.integers(0, 2**64 - 1)
sampling_values = st.one_of(st.booleans(), I64, st.floats(allow_nan=True, allow_infinity=True))
shapes = st.builds(
    RequestShape,
    offset_ns=I64,
    endpoint=st.sampled_from(["chat", "completions", "embeddings", "other"]) | st.text(max_size=5),
    model=st.text(max_size=10),
    stream=st.booleans(),
    input_tokens=I64,
    output_tokens=I64,
    output_estimated=st.booleans(),
    max_tokens=I64,
    sampling=st.dictionaries(st.text(max_size=8), sampling_values, max_size=4),
    roles=st.text(alphabet="suatdfo", max_size=8),
    has_tools=st.booleans(),
    has_response_format=st.booleans(),
    prefix_hashes=st.lists(U64, max_size=6).map(tuple),
    prefix_units=I64,
    status=I64,
    error=st.sampled_from(["", "http_5xx", "timeout"]),
    ttft_ns=I64,
    e2e_ns=I64,
    chunk_gaps_us=st.lists(st.integers(0, 2**32 - 1), max_size=6).map(tuple),
    cached_tokens=I64,
    session=U64,
    turn=I64,
    method=st.sampled_from(["POST", "GET"]),
    request_bytes=I64,
    response_bytes=I64,
    think_ns=I64,
    chat_id=U64,
    parent_id=U64,
    tool_chars=I64,
    request_type=st.sampled_from(["", "text", "search"]),
    usage_source=st.sampled_from(["", "usage", "timings"]),
    join_ids=st.lists(U64, max_size=4).map(tuple),
    spawned=st.booleans(),
)


class FakeClock:
    """Injected monotonic and wall clocks that only move when a test says so."""

    def __init__(self, wall_ns: int = 1_700_000_000 * 10**9) -> None:
        self.mono = 0
        self.wall = wall_ns

    def advance(self, seconds: float) -> None:
        self.mono += int(seconds * 1e9)
        self.wall += int(seconds * 1e9)

    def mono_ns(self) -> int:
        return self.mono

    def wall_ns(self) -> int:
        return self.wall


def exact(shape: RequestShape) -> list[tuple[str, str]]:
    """Field values compared by repr, so True vs 1, 1.0 vs 1 and NaN are told apart or matched."""
    return [(name, repr(getattr(shape, name))) for name in FIELDS]


def write(path: Path, shapes: list[RequestShape], start_wall_ns: int = 0, **options: Any) -> Path:
    """One trace file written by the recorder's writer."""
    clock = FakeClock()
    with TraceWriter(
        TraceHeader(start_wall_ns=start_wall_ns),
        path=path,
        mono_ns=clock.mono_ns,
        wall_ns=clock.wall_ns,
        **options,
    ) as writer:
        for shape in shapes:
            writer.write(shape)
    return path


def column_value(columns: trace.Columns, name: str, i: int) -> Any:
    """Request i's value of field `name`, as the Python value a RequestShape holds."""
    if name == "prefix_hashes":
        return tuple(int(h) for h in columns.hashes_of(i))
    if name == "chunk_gaps_us":
        return tuple(
            int(g) for g in columns.chunk_gaps_us[columns.chunk_index[i] : columns.chunk_index[i + 1]]
        )
    if name == "join_ids":
        return tuple(int(h) for h in columns.joins_of(i))
    value = getattr(columns, name)[i]
    return value.item() if isinstance(value, np.generic) else value


def shapes_in(columns: trace.Columns) -> list[RequestShape]:
    """The loaded columns as shapes again (arrival order), to compare whole records in tests."""
    return [
        RequestShape(**{name: column_value(columns, name, i) for name in FIELDS}) for i in range(len(columns))
    ]


def shapes_of(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[RequestShape]:
    """Every request of these trace files or directories, read by `trace.load`."""
    return shapes_in(trace.load(paths))


# --------------------------------------------------------------------------- hand-built files


def frame_bounds(data: bytes) -> list[tuple[int, int, int]]:
    """(start, end, records) of each frame, read with the documented index layout."""
    bounds, pos = [], 0
    while pos < len(data):
        magic, size, length, records = struct.unpack_from("<IIII", data, pos)
        assert (magic, size) == (0x184D2A5E, 8)
        bounds.append((pos, pos + 16 + length, records))
        pos += 16 + length
    return bounds


def _as_bytes(value: object) -> bytes:
    """encode_column's blobs (arrays, pieces) as the plain bytes msgpack writes."""
    if isinstance(value, Pieces):
        return b"".join(value.items)
    if isinstance(value, np.ndarray):
        return value.tobytes()
    raise TypeError(type(value))


def frames_with_header(header: dict[str, Any], batches: list[dict[str, Any]], sized: bool = True) -> bytes:
    """A file of our frame layout from records given as maps: a header, then batches."""
    compressor = zstandard.ZstdCompressor(write_checksum=True, write_content_size=sized)
    out = b""
    for record in [header, *batches]:
        frame = compressor.compress(msgpack.packb(record, use_bin_type=True, default=_as_bytes))
        out += struct.pack("<IIII", 0x184D2A5E, 8, len(frame), record.get("n", 0)) + frame
    return out


def batch(
    shapes: Sequence[RequestShape], extra: dict[str, tuple[str, list[Any]]] | None = None
) -> dict[str, Any]:
    """A batch record of `shapes` in the current layout, plus `extra` fields (name: (kind, values))
    appended after them, as a newer writer would add them."""
    columns = []
    for name in FIELDS:
        values = [getattr(shape, name) for shape in shapes]
        if name in ("prefix_hashes", "join_ids"):
            values = [pack_u64(v) for v in values]
        elif name == "chunk_gaps_us":
            values = [pack_u32(v) if v else b"" for v in values]
        columns.append(encode_column(FIELD_KINDS[name], values))
    for kind, values in (extra or {}).values():
        columns.append(encode_column(kind, values))
    return {"type": "batch", "n": len(shapes), "columns": columns}
