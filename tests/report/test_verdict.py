"""The verdict: the report's first lines name a winner only outside the noise, and say what weakens it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from replayproxy.cli import main
from replayproxy.results import ResultWriter, RunHeader
from tests.report.helpers import opening_of, result

SLO = "ttft<=100ms"


def _run(
    path: Path,
    label: str,
    good_share: float,
    *,
    n: int = 200,
    seed: int = 0,
    gap_ms: float = 50.0,
    **header: object,
) -> str:
    """n requests `gap_ms` apart; `good_share` of them meet the SLO (TTFT 20 ms), the rest miss (400 ms)."""
    rng = np.random.default_rng(seed)
    good = rng.random(n) < good_share
    header.setdefault("start_wall_ns", 1)
    head = RunHeader(label=label, target="http://t", trace_digest="d", **header)  # type: ignore[arg-type]
    with ResultWriter(path, head) as writer:
        for i in range(n):
            ttft = 20.0 if good[i] else 400.0
            writer.write(result(i, ttft_ms=ttft, e2e_ms=ttft + 100, sent_ms=gap_ms * i, completion_tokens=5,
                                gaps_us=[25_000] * 4))  # fmt: skip
    return str(path)


def _report(paths: list[str], capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    assert main(["report", *paths, "--slo", SLO, "--json", *extra]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["report", *paths, "--slo", SLO, *extra]) == 0
    return doc, capsys.readouterr().out


def test_a_clear_winner_is_named_with_its_margin_interval_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [_run(tmp_path / f"a{i}.rpr", "slow", 0.45, seed=i) for i in range(3)]
    paths += [_run(tmp_path / f"b{i}.rpr", "fast", 0.9, seed=10 + i) for i in range(3)]
    doc, text = _report(paths, capsys)
    v = doc["verdict"]
    assert v["winner"] == "fast" and v["versus"] == "slow" and v["noise"] == "measured"
    assert 1.6 < v["margin"]["estimate"] < 2.4 and v["margin"]["ci95_low"] > 1.0
    opening = opening_of(text)
    assert opening[0] == "Verdict"
    assert any(line.strip().startswith("fast sustains 2.") and "3 runs each" in line for line in opening)
    assert any("decided by: goodput under ttft<=100ms" in line for line in opening)
    assert not any("run-to-run noise unknown" in line for line in opening)


def test_noisy_repetitions_declare_no_winner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = [_run(tmp_path / f"a{i}.rpr", "A", share, seed=i) for i, share in enumerate((0.3, 0.95, 0.6))]
    paths += [
        _run(tmp_path / f"b{i}.rpr", "B", share, seed=9 + i) for i, share in enumerate((0.5, 0.9, 0.75))
    ]
    doc, text = _report(paths, capsys)
    assert doc["verdict"]["winner"] is None
    assert "no clear difference" in "\n".join(opening_of(text))


def test_a_goodput_margin_under_one_percent_is_no_clear_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both meet the SLO for every request: goodput is the offered rate, and B's runs ending 0.5 %
    sooner (tight repetitions, an interval excluding 1.00) is no reason to pick an engine."""
    paths = [_run(tmp_path / f"a{i}.rpr", "A", 1.0, seed=i, gap_ms=50.0 + 0.001 * i) for i in range(3)]
    paths += [_run(tmp_path / f"b{i}.rpr", "B", 1.0, seed=9 + i, gap_ms=49.75 + 0.001 * i) for i in range(3)]
    doc, text = _report(paths, capsys)
    margin = doc["verdict"]["margin"]
    assert margin["ci95_low"] > 1.0 and margin["estimate"] < 1.01  # the interval alone would name B
    assert doc["verdict"]["winner"] is None
    assert "no clear difference" in "\n".join(opening_of(text))


def test_one_run_each_says_the_noise_is_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = [_run(tmp_path / "a.rpr", "A", 0.4), _run(tmp_path / "b.rpr", "B", 0.9, seed=1)]
    doc, text = _report(paths, capsys)
    assert doc["verdict"]["noise"] == "unknown" and doc["verdict"]["winner"] == "B"
    opening = "\n".join(opening_of(text))
    assert "run-to-run noise unknown: one run of A, B; replay with --repeat 3" in opening
    assert "1 run each (provisional: run-to-run noise unknown)" in opening


def test_every_warning_that_weakens_the_verdict_is_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(
        tmp_path / "a.rpr", "A", 0.5, pre_run={"reset_prefix_cache": "failed: HTTP 404"},
        contract={"engine_config": {"cache_dtype": "fp8"}},
    )  # fmt: skip
    b = _run(tmp_path / "b.rpr", "B", 0.9, seed=1, contract={"engine_config": {"cache_dtype": "auto"}})
    doc, text = _report([a, b], capsys)
    opening = "\n".join(opening_of(text))
    assert (
        "cache not reset before the run: A (reset_prefix_cache failed: HTTP 404; start vLLM with" in opening
    )
    assert "not a like-for-like comparison: A and B differ in cache_dtype (fp8 vs auto)" in opening
    assert len(doc["verdict"]["lines"]) <= 13
    assert any("not a like-for-like" in w for w in doc["warnings"])
    contract = next(block for block in text.split("\n\n") if block.startswith("Contract\n"))
    assert "cache_dtype" in contract and "fp8" in contract


def test_markdown_and_html_open_with_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = [_run(tmp_path / "a.rpr", "A", 0.4), _run(tmp_path / "b.rpr", "B", 0.9, seed=1)]
    html = tmp_path / "r.html"
    assert main(["report", *paths, "--slo", SLO, "--markdown", "--html", str(html)]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("### Verdict")
    page = html.read_text(encoding="utf-8")
    assert page.index('class="verdict"') < page.index("<figure>")
    assert "B sustains" in page


def test_no_candidate_meeting_the_slo_is_no_clear_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [_run(tmp_path / "a.rpr", "A", 0.0), _run(tmp_path / "b.rpr", "B", 0.0, seed=1)]
    doc, text = _report(paths, capsys)
    assert doc["verdict"]["winner"] is None
    assert "no clear difference: neither A nor B meets the SLO for any request, 1 run each" in text


def test_repetitions_run_in_blocks_are_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = [_run(tmp_path / f"a{i}.rpr", "A", 0.8, seed=i, start_wall_ns=i) for i in range(2)]
    blocks += [_run(tmp_path / f"b{i}.rpr", "B", 0.8, seed=5 + i, start_wall_ns=10 + i) for i in range(2)]
    _, text = _report(blocks, capsys)
    assert "repetitions of A and B ran one candidate after the other" in text
    mixed = [_run(tmp_path / f"m{i}.rpr", "AB"[i % 2], 0.8, seed=i, start_wall_ns=i) for i in range(4)]
    _, text = _report(mixed, capsys)
    assert "one candidate after the other" not in text


def test_a_winner_over_a_candidate_meeting_the_slo_for_no_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = [_run(tmp_path / "a.rpr", "A", 0.0), _run(tmp_path / "b.rpr", "B", 0.9, seed=1)]
    doc, text = _report(paths, capsys)
    assert doc["verdict"]["winner"] == "B" and doc["verdict"]["margin"]["goodput_over_none"] > 0
    assert "B wins with " in text and "A meets it for no request, 1 run each" in text
