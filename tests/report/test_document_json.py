"""`report --json` is a contract: the same results give the same bytes, release after release.

The golden file was written by the report before its document got typed sections; the renderers
now read those sections through TypedDicts, which must not change a byte of the output. After a
deliberate schema change, regenerate it with `REGENERATE_GOLDEN=1`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from replayproxy.cli import main
from replayproxy.results import ResultWriter, RunHeader
from tests.report.helpers import result

GOLDEN = Path(__file__).parents[1] / "data" / "report-v1-golden.json"


def _run(path: Path, label: str, good_share: float, seed: int) -> str:
    """200 requests 50 ms apart; `good_share` of them meet TTFT 100 ms (20 ms), the rest miss (400 ms)."""
    good = np.random.default_rng(seed).random(200) < good_share
    header = RunHeader(label=label, target="http://t", trace_digest="d", start_wall_ns=1)
    with ResultWriter(path, header) as writer:
        for i in range(200):
            ttft = 20.0 if good[i] else 400.0
            writer.write(
                result(i, ttft_ms=ttft, e2e_ms=ttft + 100, sent_ms=50.0 * i, completion_tokens=5,
                       gaps_us=[25_000] * 4)
            )  # fmt: skip
    return path.name


def test_report_json_is_byte_identical_to_the_golden_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the document names the result files as given: relative here
    paths = [_run(tmp_path / f"a{i}.rpr", "slow", 0.45, seed=i) for i in range(2)]
    paths += [_run(tmp_path / f"b{i}.rpr", "fast", 0.9, seed=10 + i) for i in range(2)]
    slo = "ttft<=100ms,e2e:p99<=600ms"
    assert main(["report", *paths, "--slo", slo, "--json", "-o", "report.json"]) == 0
    written = (tmp_path / "report.json").read_bytes()
    if os.environ.get("REGENERATE_GOLDEN"):
        GOLDEN.write_bytes(written)
    assert written == GOLDEN.read_bytes()
    for section in (b'"verdict"', b'"goodput"', b'"comparisons"', b'"breakdowns"', b'"percentile_checks"'):
        assert section in written  # the golden file covers the typed sections
