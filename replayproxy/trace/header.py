"""The trace header: what a consumer must know to read one file's records, and the format's version."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from replayproxy.shape import FIELD_KINDS, FIELDS, HASH_SCHEME

FORMAT_NAME = "replayproxy-trace"
FORMAT_VERSION = 2  # major: a reader refuses files with a larger one; 2: sessions linked by replies
SUFFIX = ".rpt"


class TraceFormatError(ValueError):
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
        known = {k: v for k, v in record.items() if k in cls.__dataclass_fields__}
        known["fields"] = tuple(known.get("fields", FIELDS))
        known["extra"] = dict(known.get("extra") or {})
        return cls(**known)
