"""Plain-text (terminal) and Markdown (PR / wiki) renderings of the report tables; formatting only."""

from __future__ import annotations

from replayproxy.report.cells import Table
from replayproxy.report.document_types import Document
from replayproxy.report.sections import report_tables


def _aligned(table: Table) -> list[str]:
    lines = [table.title, "-" * len(table.title)]
    if table.header:
        grid = [table.header, *table.rows]
        widths = [max(len(row[i]) for row in grid) for i in range(len(table.header))]
        for row in grid:
            cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))]
            lines.append("  ".join(cells).rstrip())
    lines.extend(f"  {note}" for note in table.notes)
    return lines


def format_text(ts: list[Table]) -> str:
    return "\n\n".join("\n".join(_aligned(t)) for t in ts) + "\n"


def render_text(doc: Document) -> str:
    return format_text(report_tables(doc))


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
