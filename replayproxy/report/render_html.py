"""One self-contained HTML file: the report tables plus inline SVG plots; nothing is fetched to view it."""

from __future__ import annotations

import html

from replayproxy.report.cells import Table
from replayproxy.report.document_types import Document
from replayproxy.report.plots import PLOTS, to_svg
from replayproxy.report.runs import Run
from replayproxy.report.sections import report_tables

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
p.note { color: #555; font-size: 12px; margin: 0.2em 0; }
figure { margin: 0 0 2em; }
figure svg { max-width: 100%; height: auto; }
div.verdict { border: 2px solid #336; background: #f4f6fb; padding: 0.6em 1em; margin: 0 0 1.5em; }
div.verdict p { margin: 0.2em 0; font-size: 14px; }
div.verdict p.warning { color: #8a4b00; }
"""


def _verdict(doc: Document) -> str:
    """The verdict box, on top: the same lines the text report opens with."""
    lines = []
    for line in doc["verdict"]["lines"]:
        css = ' class="warning"' if line.startswith("warning:") else ""
        lines.append(f"<p{css}>{html.escape(line)}</p>")
    return '<div class="verdict"><h2 id="verdict">Verdict</h2>' + "".join(lines) + "</div>"


def _table(t: Table) -> str:
    parts = [f'<h2 id="{html.escape(t.key)}">{html.escape(t.title)}</h2>']
    if t.header:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in t.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows
        )
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    parts.extend(f'<p class="note">{html.escape(n)}</p>' for n in t.notes)
    return "\n".join(parts)


def render_html(doc: Document, runs: list[Run]) -> str:
    """The whole report; `runs` are the columns in document order (the plots need per-request data)."""
    figures = []
    for title, draw in PLOTS:
        fig = draw(doc, runs)
        if fig is not None:
            figures.append(f"<figure><h2>{html.escape(title)}</h2>{to_svg(fig)}</figure>")
    labels = ", ".join(dict.fromkeys(r["label"] for r in doc["runs"]))
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>replayproxy report: {html.escape(labels)}</title>",
            f"<style>{STYLE}</style></head><body>",
            f"<h1>replayproxy report</h1><p>{html.escape(labels)}</p>",
            _verdict(doc),
            *figures,
            *(_table(t) for t in report_tables(doc) if t.key != "verdict"),
            "</body></html>",
            "",
        ]
    )
