"""The trace header: what a consumer must know to read one file's records, and the format's version."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import asdict, dataclass, field
from typing import Any

from replayproxy.errors import BadInputFile
from replayproxy.shape import FIELD_KINDS, FIELDS, HASH_SCHEME

FORMAT_NAME = "replayproxy-trace"
FORMAT_VERSION = 2  # major: a reader refuses files with a larger one; 2: sessions linked by replies
SUFFIX = ".rpt"


class TraceFormatError(BadInputFile):
    """The file is not a readable trace (not ours, newer major version, or unreadable header)."""


@dataclass(frozen=True, slots=True)
class TraceHeader:
    """What a consumer must know to interpret the records of one file."""

    start_wall_ns: int  # UTC time of offset 0; files of one recorder share it
    source: str = "proxy"  # proxy | synth | import:<format>
    block_size: int = 16
    block_unit: str = "token"  # token | char
    hash_scheme: str = HASH_SCHEME
    key_fingerprint: str = ""
    upstream: str = ""
    tokenizer: str = ""
    recorder: str = ""
    created_wall_ns: int = 0
    fields: tuple[str, ...] = FIELDS
    extra: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["type"] = "header"
        record["fields"] = list(self.fields)
        record["kinds"] = {name: FIELD_KINDS[name] for name in self.fields}
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TraceHeader:
        known = checked_fields(cls, record)
        known["fields"] = tuple(known.get("fields", FIELDS))
        known["extra"] = dict(known.get("extra") or {})
        return cls(**known)


def checked_fields(cls: type[Any], record: dict[str, Any]) -> dict[str, Any]:
    """The entries of a header `record` that dataclass `cls` declares, each of its declared type
    (a list stands for a tuple); a missing required one or a wrong type is a TraceFormatError."""
    hints = typing.get_type_hints(cls)
    known: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in record:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TraceFormatError(f"header lacks {f.name!r}")
            continue
        value = record[f.name]
        if not _is_a(value, hints[f.name]):
            raise TraceFormatError(f"header's {f.name!r} is not of type {_type_name(hints[f.name])}")
        known[f.name] = value
    return known


def _is_a(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is int:  # within ±2**62, so that differences (of start times, say) fit in int64
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 62
    if hint in (str, bool, float):
        return isinstance(value, hint)
    origin = typing.get_origin(hint)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return isinstance(value, list | tuple) and all(_is_a(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))
