"""Plain-text (terminal) and Markdown (PR / wiki) renderings of the report tables; formatting only."""

from __future__ import annotations

import shutil
import textwrap
from typing import TextIO

from replayproxy.report.cells import Table
from replayproxy.report.document_types import Document
from replayproxy.report.sections import report_tables

WIDTH = 100  # columns a report fits when not shown on a wider terminal
GAP = "  "
ELLIPSIS = "\u2026"


def text_width(stream: TextIO) -> int:
    """The terminal's width when `stream` is one and it is wider than WIDTH; WIDTH otherwise (a file,
    a pipe, a CI log)."""
    return max(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns) if stream.isatty() else WIDTH


def _aligned(table: Table, width: int) -> list[str]:
    lines = [table.title, "-" * len(table.title)]
    if table.header:
        grid = [table.header, *table.rows]
        widths = [max(len(row[i]) for row in grid) for i in range(len(table.header))]
        keys = min(table.keys, len(widths))
        for n, block in enumerate(_blocks(widths, keys, width)):
            if n:
                lines.append("")
            columns = [*range(keys), *block]
            for row in grid:
                cells = [_fit(row[i], widths[i]) for i in columns]
                padded = [
                    c.ljust(widths[i]) if i < keys else c.rjust(widths[i])
                    for c, i in zip(cells, columns, strict=True)
                ]
                lines.append(GAP.join(padded).rstrip())
    for note in table.notes:
        lines.extend(
            textwrap.wrap(note, width, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
        )
    return lines


def _blocks(widths: list[int], keys: int, width: int) -> list[list[int]]:
    """The value columns in blocks that fit `width` beside the key columns, each block printed under
    the one before (as a wide table is in a narrow terminal); a column too wide alone is cut (_fit)."""
    room = width - sum(widths[:keys]) - len(GAP) * keys
    blocks: list[list[int]] = [[]]
    used = 0
    for i in range(keys, len(widths)):
        widths[i] = min(widths[i], max(room, len(ELLIPSIS) + 1))
        if blocks[-1] and used + widths[i] > room:
            blocks.append([])
            used = 0
        blocks[-1].append(i)
        used += widths[i] + len(GAP)
    return blocks


def _fit(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - len(ELLIPSIS)] + ELLIPSIS


def format_text(ts: list[Table], width: int = WIDTH) -> str:
    return "\n\n".join("\n".join(_aligned(t, width)) for t in ts) + "\n"


def render_text(doc: Document, width: int = WIDTH) -> str:
    return format_text(report_tables(doc), width)


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|")


def _markdown(table: Table) -> list[str]:
    lines = [f"### {table.title}", ""]
    if table.header:
        lines.append("| " + " | ".join(_escape(c) for c in table.header) + " |")
        lines.append("|" + "|".join(["---", *["---:"] * (len(table.header) - 1)]) + "|")
        lines.extend("| " + " | ".join(_escape(c) for c in row) + " |" for row in table.rows)
        lines.append("")
    # The verdict's lines stay lines (a list); other notes are quoted.
    lines.extend(f"- {note}" if table.key == "verdict" else f"> {note}" for note in table.notes)
    return lines


def format_markdown(ts: list[Table]) -> str:
    return "\n".join(line for t in ts for line in [*_markdown(t), ""])


def render_markdown(doc: Document) -> str:
    return format_markdown(report_tables(doc))
