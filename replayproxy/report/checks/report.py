"""Check results (.rpc) inside `replayproxy report`: inputs told apart, documents built, gate applied.

Replay results and check results may be given together; each kind gets its own part of the
report. The JSON output keeps check documents under `checks` (docs/check.md).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from replayproxy.errors import BadOption
from replayproxy.report.checks.document_types import CheckDoc
from replayproxy.report.checks.summary import build_check_document
from replayproxy.report.checks.tables import render_check_markdown, render_check_text
from replayproxy.report.checks.verdict import GATE_METRICS, gate_values
from replayproxy.report.gate import GateRule, failed_rules, parse_gate
from replayproxy.report.render_json import render_json
from replayproxy.results import CHECK_SUFFIX, SUFFIX, load_checks


def split_inputs(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[str], list[str]]:
    """(check inputs, replay inputs): files by suffix, directories into each kind they hold."""
    checks: list[str] = []
    replays: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            if any(path.glob(f"*{CHECK_SUFFIX}")):
                checks.append(str(path))
            if any(path.glob(f"*{SUFFIX}")) or not any(path.glob(f"*{CHECK_SUFFIX}")):
                replays.append(str(path))
            continue
        matches = [str(path)] if path.exists() else sorted(glob.glob(str(raw))) or [str(raw)]
        for match in matches:
            (checks if match.endswith(CHECK_SUFFIX) else replays).append(match)
    return checks, replays


def split_gate(spec: str) -> tuple[str, str]:
    """(check rules, replay rules) of one --gate spec: replay rules are relative (`*BASE`),
    check rules absolute shares and scores."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    relative = [part for part in parts if "*base" in "".join(part.split()).lower()]
    return ",".join(p for p in parts if p not in relative), ",".join(relative)


def parse_check_gate(spec: str) -> tuple[GateRule, ...]:
    """Check metrics are shares and scores: absolute thresholds, no statistic."""
    rules = parse_gate(spec, GATE_METRICS)
    for rule in rules:
        if rule.relative or rule.stat:
            raise BadOption(f"--gate {rule.text!r}: check metrics take a plain threshold, e.g. match>=0.95")
    return rules


def check_documents(paths: Sequence[str], gate: Sequence[GateRule] = (), spec: str = "") -> list[CheckDoc]:
    """One document per check file; with gate rules, each carries its gate outcome."""
    docs = [build_check_document(f) for f in load_checks(paths)]
    if gate:
        for doc in docs:
            doc["gate"] = {"spec": spec, "failures": failed_rules(gate, gate_values(doc))}
    return docs


def render_checks(docs: Sequence[CheckDoc], as_json: bool, markdown: bool) -> str:
    if as_json:
        return render_json({"checks": list(docs)})
    render = render_check_markdown if markdown else render_check_text
    return "\n".join(render(doc) for doc in docs)
