"""The report's check side on hand-made check files: every figure, the verdict's wording, the gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from replayproxy.cli import main
from replayproxy.report.checks.report import check_documents, parse_check_gate, render_checks, split_inputs
from replayproxy.results import ResultWriter, RunHeader
from tests.report.check_helpers import both, row, write_check


def doc_of(path: Path) -> dict[str, Any]:
    (doc,) = check_documents([str(path)])
    return doc


def target(doc: dict[str, Any], label: str) -> dict[str, Any]:
    return next(t for t in doc["targets"] if t["label"] == label)


def test_identical_targets(tmp_path: Path) -> None:
    doc = doc_of(write_check(tmp_path / "c.rpc", both()))
    b = target(doc, "B")
    assert (b["match"], b["similarity"], b["prompt_tokens_equal"], b["determinism"]) == (1.0, 1.0, 1.0, 1.0)
    assert target(doc, "A")["prompt_tokens_equal"] is None and target(doc, "A")["match"] is None
    assert (
        doc["verdict"]
        == "B matches A on 100 % of 4 prompts; prompt tokens equal; every target deterministic over 2 repeats"
    )


def test_template_difference_comes_first_with_per_message_numbers(tmp_path: Path) -> None:
    rows = both(prompt_tokens=26, output_hash="other", similarity_ppm=500_000)
    doc = doc_of(write_check(tmp_path / "c.rpc", rows))
    b = target(doc, "B")
    assert b["prompt_tokens_delta_mean"] == 6 and b["prompt_tokens_delta_per_message"] == 3
    assert doc["findings"][0] == (
        "PROMPT TOKENS DIFFER: B renders identical requests with 6 more tokens per request (3 per message) "
        "than A (another chat template or tokenizer; equal on 0 %)"
    )
    assert (
        doc["findings"][1]
        == "100 % of B's outputs differ from A's at temperature 0 (similarity 0.50 where they differ)"
    )


def test_stop_lengths_structure_and_determinism(tmp_path: Path) -> None:
    rows = [
        row("A", p, r, has_stop=p < 2, json_valid=1 if p == 3 else -1) for p in range(4) for r in range(2)
    ]
    rows += [
        row(
            "B",
            p,
            r,
            has_stop=p < 2,
            finish_reason="length" if p < 2 else "stop",
            completion_tokens=32 if p < 2 else 10,
            json_valid=0 if p == 3 else -1,
            output_hash=f"h{p}" if p < 2 or r == 0 else f"x{p}{r}",
            similarity_ppm=900_000 if p < 2 else 1_000_000,
        )
        for p in range(4)
        for r in range(2)
    ]
    doc = doc_of(write_check(tmp_path / "c.rpc", rows))
    b = target(doc, "B")
    assert b["stop_prompts"] == 2 and b["stop_prompts_ended_by_stop"] == 0 and b["length_share"] == 0.5
    assert b["json_valid"] == 0.0 and target(doc, "A")["json_valid"] == 1.0
    assert b["determinism"] == 0.5 and b["nondeterministic_prompts"] == ["p2", "p3"]
    findings = doc["findings"]
    assert (
        "B finishes 0 of 2 prompts that carry `stop` with finish_reason stop, A 2 (mean 32 vs 10 tokens)"
        in findings
    )
    assert "JSON valid 0 % at B vs 100 % at A" in findings
    assert "B is not deterministic: 2 prompts changed across its 2 repeats (50 % stable)" in findings


def test_errors_are_not_matches(tmp_path: Path) -> None:
    rows = [row("A", p, r) for p in range(4) for r in range(2)]
    rows += [
        row("B", p, r, error="timeout", status=0) if p == 0 else row("B", p, r)
        for p in range(4)
        for r in range(2)
    ]
    doc = doc_of(write_check(tmp_path / "c.rpc", rows))
    b = target(doc, "B")
    assert (
        b["compared"] == 3 and b["match"] == 1.0 and b["errors"] == 2 and b["error_classes"] == {"timeout": 2}
    )
    assert "B failed 2 of 8 requests (timeout on p0)" in doc["findings"]


def test_worst_prompts_and_kept_texts(tmp_path: Path) -> None:
    rows = [row("A", p, r, output=f"answer {p}") for p in range(4) for r in range(2)]
    rows += [
        row("B", p, r, output_hash="d" if p else "h0", similarity_ppm=100_000 * (p + 1), output=f"other {p}")
        for p in range(4)
        for r in range(2)
    ]
    doc = doc_of(write_check(tmp_path / "c.rpc", rows, keep=True))
    worst = target(doc, "B")["worst"]
    assert [w["id"] for w in worst] == ["p1", "p2", "p3"] and worst[0]["outputs"] == ["answer 1", "other 1"]
    text = render_checks([doc], False, False)
    assert text.startswith("Output check verdict") and "Worst-differing prompts, B vs A" in text
    assert "p1: A: 'answer 1' | B: 'other 1'" in text
    markdown = render_checks([doc], False, True)
    assert "### Output check per target" in markdown and "| exact match |" in markdown
    assert (
        orjson.loads(render_checks([doc], True, False))["checks"][0]["targets"][1]["worst"][0]["id"] == "p1"
    )


def test_gate(tmp_path: Path) -> None:
    path = write_check(tmp_path / "c.rpc", both(output_hash="z", similarity_ppm=0))
    (doc,) = check_documents(
        [str(path)], parse_check_gate("match>=0.95,determinism>=1"), "match>=0.95,determinism>=1"
    )
    assert doc["gate"]["failures"] == ["match>=0.95: B 0"]
    with pytest.raises(ValueError, match="unknown metric 'ttft'"):
        parse_check_gate("ttft<=1")
    with pytest.raises(ValueError, match="check metrics take a plain threshold"):
        parse_check_gate("match>=0.9*BASE")


def test_a_failing_gate_says_so_in_one_line_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_check(tmp_path / "c.rpc", both(output_hash="z", similarity_ppm=0))
    assert main(["report", str(path), "--gate", "match>=0.95,determinism>=1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["replayproxy report: gate failed: match>=0.95: B 0"]


def test_split_inputs(tmp_path: Path) -> None:
    write_check(tmp_path / "c.rpc", both())
    with ResultWriter(tmp_path / "r.rpr", RunHeader("x", "http://x", 0)):
        pass
    only_checks = tmp_path / "checks"
    only_checks.mkdir()
    write_check(only_checks / "d.rpc", both())
    assert split_inputs([tmp_path]) == ([str(tmp_path)], [str(tmp_path)])
    assert split_inputs([only_checks]) == ([str(only_checks)], [])
    assert split_inputs([str(tmp_path / "*.rpc"), tmp_path / "r.rpr"]) == (
        [str(tmp_path / "c.rpc")],
        [str(tmp_path / "r.rpr")],
    )
