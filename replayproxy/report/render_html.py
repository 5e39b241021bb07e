"""One self-contained HTML file: the report tables plus inline SVG plots; nothing is fetched to view it."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from replayproxy.report.cells import Table
from replayproxy.report.document_types import Document
from replayproxy.report.plot_panel import comparison_panel
from replayproxy.report.plots import PLOTS, to_svg
from replayproxy.report.runs import Run
from replayproxy.report.sections import report_tables

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 1.5em 1.5em; color: #222; }
nav { position: sticky; top: 0; z-index: 1; background: #fff; border-bottom: 1px solid #ccc;
      padding: 0.4em 0; margin-bottom: 0.8em; font-size: 13px; display: flex; flex-wrap: wrap;
      gap: 0.2em 1.1em; }
nav a { color: #336; text-decoration: none; white-space: nowrap; }
nav a:hover { text-decoration: underline; }
h2 { scroll-margin-top: 3em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f0f0f0; }
p.note { color: #555; font-size: 12px; margin: 0.2em 0; }
figure { margin: 0 0 2em; }
figure svg { width: 100%; height: auto; display: block; }
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


def _figure(key: str, title: str, fig: Figure | None) -> tuple[str, str] | None:
    if fig is None:
        return None
    return key, f'<figure><h2 id="{key}">{html.escape(title)}</h2>{to_svg(fig)}</figure>'


def _nav(links: list[tuple[str, str]]) -> str:
    return "<nav>" + "".join(f'<a href="#{key}">{html.escape(text)}</a>' for key, text in links) + "</nav>"


GLANCE = ("at-a-glance", "At a glance", "At a glance: each candidate with its 95% interval")


def render_html(doc: Document, runs: list[Run]) -> str:
    """The whole report; `runs` are the columns in document order (the plots need per-request data).

    Order: a navigation bar, the verdict box, the comparison at a glance (a small panel per metric
    with each candidate's interval), the plots, then the tables."""
    key, link, title = GLANCE
    figures = [(link, _figure(key, title, comparison_panel(doc, runs)))]
    figures += [(t, _figure(f"plot-{i}", t, draw(doc, runs))) for i, (t, draw) in enumerate(PLOTS)]
    drawn = [(text, figure) for text, figure in figures if figure is not None]
    tables = [t for t in report_tables(doc) if t.key != "verdict"]
    links = [("verdict", "Verdict"), *((figure[0], text) for text, figure in drawn)]
    firsts: dict[str, str] = {}
    for t in tables:  # several tables of one key (the paired comparisons) share one link
        firsts[t.key] = t.title.partition(":")[0] if t.key in firsts else t.title
    links += list(firsts.items())
    labels = ", ".join(dict.fromkeys(r["label"] for r in doc["runs"]))
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>replayproxy report: {html.escape(labels)}</title>",
            f"<style>{STYLE}</style></head><body>",
            _nav(links),
            f"<h1>replayproxy report</h1><p>{html.escape(labels)}</p>",
            _verdict(doc),
            *(figure[1] for _, figure in drawn),
            *(_table(t) for t in tables),
            "</body></html>",
            "",
        ]
    )
