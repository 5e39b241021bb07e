"""A check document as tables (verdict, per-target figures, worst-differing prompts, warnings).

The same `Table` as the replay report, so the text and Markdown renderers format both alike.
"""

from __future__ import annotations

from collections.abc import Callable

from replayproxy.report.cells import Table, fmt, pct
from replayproxy.report.checks.document_types import CheckDoc, CheckTargetDoc
from replayproxy.report.render_text import format_markdown, format_text

OUTPUT_PREVIEW = 160  # characters of each kept output shown beside a worst-differing prompt

Cell = Callable[[CheckTargetDoc], str]


def _finish(t: CheckTargetDoc) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(t["finish_reasons"].items())) or "-"


def _stops(t: CheckTargetDoc) -> str:
    return f"{t['stop_prompts_ended_by_stop']}/{t['stop_prompts']}" if t["stop_prompts"] else "-"


ROWS: tuple[tuple[str, Cell], ...] = (
    ("model", lambda t: t["model"] or "-"),
    ("answers (errors)", lambda t: f"{t['answers']} ({t['errors']})"),
    ("prompt tokens equal", lambda t: pct(t["prompt_tokens_equal"])),
    ("prompt tokens Δ / request", lambda t: fmt(t["prompt_tokens_delta_mean"])),
    ("prompt tokens Δ / message", lambda t: fmt(t["prompt_tokens_delta_per_message"])),
    ("exact match", lambda t: pct(t["match"])),
    ("similarity", lambda t: fmt(t["similarity"])),
    ("similarity where different", lambda t: fmt(t["similarity_differing"])),
    ("deterministic prompts", lambda t: pct(t["determinism"])),
    ("finish reasons", _finish),
    ("natural length p50 (tokens)", lambda t: fmt(t["natural_tokens_p50"])),
    ("`stop` prompts ended by stop", _stops),
    ("JSON valid", lambda t: pct(t["json_valid"])),
    ("schema valid", lambda t: pct(t["schema_valid"])),
    ("tool calls valid", lambda t: pct(t["tool_valid"])),
    ("tool called", lambda t: pct(t["tool_call_rate"])),
    ("reference match", lambda t: pct(t["reference_match"])),
    ("reference similarity", lambda t: fmt(t["reference_similarity"])),
    ("user score (mean)", lambda t: fmt(t["score"])),
    ("E2E p50 ms", lambda t: fmt(t["e2e_p50_ms"])),
)


def check_tables(doc: CheckDoc) -> list[Table]:
    tables = [Table("Output check verdict", [], [], list(doc["findings"]), "check-verdict")]
    targets = doc["targets"]
    header = ["", *(t["label"] + (" (baseline)" if t["baseline"] else "") for t in targets)]
    rows = [[name, *(cell(t) for t in targets)] for name, cell in ROWS]
    sampling = doc["sampling"]
    note = (
        f"{doc['prompt_count']} prompts ({doc['prompts']}) x {doc['repeat']} repeats, concurrency "
        f"{doc['concurrency']}, temperature {sampling.get('temperature')}, seed {sampling.get('seed')}, "
        f"max_tokens {sampling.get('max_tokens')}"
    )
    tables.append(Table("Output check per target", header, rows, [note], "check-targets"))
    tables += _worst_tables(doc)
    if gate := doc.get("gate"):
        lines = [f"FAILED {line}" for line in gate["failures"]] or [f"passed: {gate['spec']}"]
        tables.append(Table("Gate", [], [], lines, "check-gate"))
    tables.append(Table("Check warnings", [], [], list(doc["warnings"]), "check-warnings"))
    return tables


def _worst_tables(doc: CheckDoc) -> list[Table]:
    base = doc["baseline"]
    tables = []
    for t in doc["targets"]:
        if not t["worst"]:
            continue
        header = ["prompt id", "similarity", "prompt tokens", "completion tokens", "finish"]
        rows = [
            [
                w["id"],
                fmt(w["similarity"]),
                "/".join(map(str, w["prompt_tokens"])),
                "/".join(map(str, w["completion_tokens"])),
                "/".join(w["finish_reasons"]),
            ]
            for w in t["worst"]
        ]
        notes = [f"pairs are {base}/{t['label']}"]
        for w in t["worst"]:
            if "outputs" in w:
                a, b = (_preview(text) for text in w["outputs"])
                notes.append(f"{w['id']}: {base}: {a!r} | {t['label']}: {b!r}")
        tables.append(
            Table(f"Worst-differing prompts, {t['label']} vs {base}", header, rows, notes, "check-worst")
        )
    return tables


def _preview(text: str) -> str:
    return text if len(text) <= OUTPUT_PREVIEW else text[:OUTPUT_PREVIEW] + "…"


def render_check_text(doc: CheckDoc) -> str:
    return format_text(check_tables(doc))


def render_check_markdown(doc: CheckDoc) -> str:
    return format_markdown(check_tables(doc))
