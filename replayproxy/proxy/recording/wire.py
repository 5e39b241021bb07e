"""The pipe between the proxy and its recorder process: msgpack messages `[kind, payload]`.

Proxy to recorder: `config` (settings, the hash key, the trace's time anchor) once, then
`captures` batches, `rotate` and `close`. Recorder to proxy: `tally` reports (tally.py).
A capture crosses as a flat list of the fields shape building reads: the same bytes the
forwarding path kept, nothing more (the request path, used only to classify, stays behind).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgpack

from replayproxy.clock import Anchor
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.settings import ProxySettings

CONFIG, CAPTURES, ROTATE, CLOSE, TALLY = "config", "captures", "rotate", "close", "tally"
_PATHS = frozenset(f.name for f in dataclasses.fields(ProxySettings) if "Path" in str(f.type))


def packer() -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True)


def unpacker() -> msgpack.Unpacker:
    # Captures hold up to max_buffered_body_bytes + max_captured_response_bytes; the default limits
    # would refuse a large one, and the proxy's own queue bounds already cap what is sent.
    return msgpack.Unpacker(raw=False, max_buffer_size=0, strict_map_key=False)


def capture_record(c: Capture) -> list[Any]:
    """The forwarding process's side: about 27k instructions for a 32-chunk stream (BENCHMARKS.md)."""
    return [
        c.arrival_ns, c.endpoint, c.method, c.request_body, c.request_bytes, c.body_truncated,
        c.injected_usage, c.status, c.event_stream, c.pieces, c.piece_ns, c.response_bytes,
        c.response_truncated, c.end_ns, c.error,
    ]  # fmt: skip


def capture_from(record: list[Any]) -> Capture:
    (arrival_ns, endpoint, method, request_body, request_bytes, body_truncated, injected_usage, status,
     event_stream, pieces, piece_ns, response_bytes, response_truncated, end_ns, error) = record  # fmt: skip
    return Capture(
        arrival_ns, endpoint, method, "", request_body=request_body, request_bytes=request_bytes,
        body_truncated=body_truncated, injected_usage=injected_usage, status=status,
        event_stream=event_stream, pieces=pieces, piece_ns=piece_ns, response_bytes=response_bytes,
        response_truncated=response_truncated, end_ns=end_ns, error=error,
    )  # fmt: skip


def config_record(settings: ProxySettings, key: bytes, anchor: Anchor) -> dict[str, Any]:
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(ProxySettings)}
    fields.update((name, str(fields[name])) for name in _PATHS if fields[name] is not None)
    return {"settings": fields, "key": key, "anchor": [anchor.mono_ns, anchor.wall_ns]}


def config_from(record: dict[str, Any]) -> tuple[ProxySettings, bytes, Anchor]:
    fields: dict[str, Any] = {}
    for name, value in record["settings"].items():
        fields[name] = Path(value) if name in _PATHS and value is not None else value
        if isinstance(value, list):
            fields[name] = tuple(value)
    mono_ns, wall_ns = record["anchor"]
    return ProxySettings(**fields), record["key"], Anchor(mono_ns=mono_ns, wall_ns=wall_ns)
