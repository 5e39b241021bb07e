"""CSV traces (Azure, BurstGPT) read a batch of rows at a time: memory bounded by the batch, not the file."""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from replayproxy.formats.importing import BadLines, ImportFormatError

BATCH_ROWS = 1 << 16  # data rows parsed and converted at a time
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # bytes that `surrogateescape` kept from a failed decode


class CsvBatches:
    """A CSV file's header positions (`where`) and its data rows in batches, with their line numbers.

    Rows with the wrong number of fields are kept, so that the caller's row checks (`csv_problem`)
    report bad lines in file order. A leading byte-order mark is dropped; a line that is not UTF-8
    is a bad line (named, skippable), not a failure of the whole file. Blank rows are skipped.
    """

    def __init__(self, path: Path, required: Sequence[str], bad: BadLines, batch_rows: int = 0) -> None:
        self._stream = io.TextIOWrapper(
            open(path, "rb"), encoding="utf-8-sig", errors="surrogateescape", newline=""
        )
        self._reader = csv.reader(self._stream)
        self._bad = bad
        self._batch_rows = batch_rows or BATCH_ROWS
        header = [name.strip() for name in next(self._reader, [])]
        missing = [name for name in required if name not in header]
        if missing:
            self.close()
            raise ImportFormatError(
                f"{path}:1: header {header} lacks {missing}; expected columns {list(required)}"
            )
        self.where = {name: i for i, name in enumerate(header)}

    def __iter__(self) -> Iterator[tuple[list[list[str]], list[int]]]:
        reader = self._reader
        rows: list[list[str]] = []
        line_nos: list[int] = []
        for row in reader:
            if any(cell.strip() for cell in row):
                rows.append(row)
                line_nos.append(reader.line_num)  # the line the row ends on
                if len(rows) >= self._batch_rows:
                    yield self._decoded(rows, line_nos)
                    rows, line_nos = [], []
        if rows:
            yield self._decoded(rows, line_nos)

    def _decoded(self, rows: list[list[str]], line_nos: list[int]) -> tuple[list[list[str]], list[int]]:
        """The rows that were UTF-8 (the others reported); one search covers a batch without any."""
        if not _NOT_UTF8.search("\x00".join(itertools.chain.from_iterable(rows))):
            return rows, line_nos
        good: list[list[str]] = []
        good_nos: list[int] = []
        for row, line_no in zip(rows, line_nos, strict=True):
            if found := _NOT_UTF8.search("\x00".join(row)):
                self._bad(line_no, f"not UTF-8 text (byte 0x{ord(found.group()) - 0xDC00:02x})")
            else:
                good.append(row)
                good_nos.append(line_no)
        return good, good_nos

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> CsvBatches:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def csv_problem(width: int, problem: Callable[[list[str]], str | None]) -> Callable[[list[str]], str | None]:
    """A row check that first checks the field count against the header's."""

    def check(row: list[str]) -> str | None:
        return f"{len(row)} fields where the header has {width}" if len(row) != width else problem(row)

    return check


def same_width(rows: list[list[str]], width: int) -> None:
    """Raise ValueError (sending the caller to its row-by-row path) if a row has another width."""
    if any(len(row) != width for row in rows):
        raise ValueError("ragged rows")
