"""The trace header: what a consumer must know to read one file's records, and the format's version."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import types
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
        return cls(**checked_fields(cls, record))


def checked_fields(cls: type[Any], record: dict[str, Any]) -> dict[str, Any]:
    """The entries of a header `record` that dataclass `cls` declares, each read as its declared
    type (a list stands for a tuple, a map for a dataclass; a TypedDict's own keys are checked, a
    newer writer's other keys kept); a missing required one or a wrong type is a TraceFormatError
    naming the entry (`contract.max_model_len`). The one reading path of every file header."""
    return _fields(cls, record, "")


def _fields(cls: type[Any], record: dict[str, Any], where: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    known: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in record:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TraceFormatError(f"header lacks {where + f.name!r}")
            continue
        known[f.name] = _read(record[f.name], hints[f.name], where + f.name)
    return known


def _read(value: Any, hint: Any, name: str) -> Any:
    """`value` as type `hint` holds it, or TraceFormatError naming entry `name`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if hint is int:  # within ±2**62, so that differences (of start times, say) fit in int64
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 62:
            return value
    elif hint is float:  # an int stands for a float, as in Python's typing
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    elif hint in (str, bool) or hint is type(None):
        if isinstance(value, hint):
            return value
    elif origin in (types.UnionType, typing.Union):
        for option in typing.get_args(hint):
            with contextlib.suppress(TraceFormatError):
                return _read(value, option, name)
    elif origin is typing.Literal:
        if value in typing.get_args(hint):
            return value
    elif origin in (tuple, list):
        if isinstance(value, list | tuple):
            item = typing.get_args(hint)[0]
            items = [_read(v, item, f"{name}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
    elif _is_map(value) and dataclasses.is_dataclass(hint):
        cls = typing.cast(type[Any], hint)
        return cls(**_fields(cls, value, f"{name}."))
    elif _is_map(value) and typing.is_typeddict(hint):
        return _typed_map(value, hint, name)
    elif _is_map(value) and origin is dict:
        kind = typing.get_args(hint)[1]
        return value if kind is Any else {k: _read(v, kind, f"{name}.{k}") for k, v in value.items()}
    elif origin is None and not typing.is_typeddict(hint) and isinstance(value, hint):
        return value
    raise TraceFormatError(f"header's {name!r} is not of type {_type_name(hint)}")


def _is_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def _typed_map(value: dict[str, Any], hint: Any, name: str) -> dict[str, Any]:
    """A TypedDict's declared keys checked, in the file's order; keys a newer writer added kept as
    they are, so that a header read and written again loses nothing."""
    hints = typing.get_type_hints(hint)
    missing = [k for k in hints if k in hint.__required_keys__ and k not in value]
    if missing:
        raise TraceFormatError(f"header lacks {f'{name}.{missing[0]}'!r}")
    return {k: _read(v, hints[k], f"{name}.{k}") if k in hints else v for k, v in value.items()}


def _type_name(hint: Any) -> str:
    """`int | None`, `tuple[CheckTarget, ...]`: the annotation as written, without module paths."""
    text = str(hint) if typing.get_origin(hint) is not None else getattr(hint, "__name__", str(hint))
    return re.sub(r"\b(?:[a-z_]\w*\.)+", "", text)
