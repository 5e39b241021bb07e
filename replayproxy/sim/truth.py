"""The ground-truth log: one JSON line per request with the wall-clock time of every written chunk.

Tests compare the replayer's and the proxy's timestamps and token counts against these lines, so
each line is flushed as soon as its request ends (readers may follow the file while the sim runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, Any

import orjson


@dataclass(slots=True)
class TruthRecord:
    """What really happened to one request; times are `time.time_ns()` taken right after each write."""

    endpoint: str
    arrival_ns: int
    id: str | None = None
    status: int = 200
    stream: bool = False
    chunk_ns: list[int] = field(default_factory=list)
    # One letter per chunk_ns entry: r role-only, c content, R reasoning, u usage-only, d [DONE],
    # b a whole non-streaming body, e an error body.
    kinds: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    fault: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class TruthLog:
    """Appends records to a file; a no-op sink when no file is configured."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[bytes] | None = open(path, "ab") if path else None  # closed in close()

    def write(self, record: TruthRecord) -> None:
        if self._file is not None:
            self._file.write(orjson.dumps(record.to_record()) + b"\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
