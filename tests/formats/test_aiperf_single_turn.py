"""AIPerf single-turn export: the replayer's prompts with their times and output lengths."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from replayproxy import cli
from tests.formats.helpers import conversation_trace

AIPERF_PYTHON = os.environ.get("REPLAYPROXY_AIPERF_PYTHON", "")


def export(tmp_path: Path) -> list[dict[str, object]]:
    out = tmp_path / "single.jsonl"
    assert (
        cli.main(["export", str(conversation_trace(tmp_path / "t.rpt")), "-f", "aiperf", "-o", str(out)]) == 0
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_rows_carry_prompt_time_and_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = export(tmp_path)
    printed = capsys.readouterr().out
    assert [r["timestamp"] for r in rows] == [0, 250, 900, 1500, 1500, 3001]
    assert [r["output_length"] for r in rows] == [40, 10, 60, 7, 300, 20]
    words = [str(r["text"]).split() for r in rows]
    assert [len(w) for w in words] == [1329, 1106, 1489, 4, 2047, 2647]  # the replayer's prompts
    assert words[0][:1024] == words[1][:1024]  # the shared system prompt stays shared
    assert "--custom-dataset-type single_turn --fixed-schedule --extra-inputs ignore_eos:true" in printed


@pytest.mark.skipif(
    not AIPERF_PYTHON, reason="opt-in: REPLAYPROXY_AIPERF_PYTHON=<python with aiperf installed>"
)
def test_aiperf_own_model_accepts_every_row(tmp_path: Path) -> None:
    export(tmp_path)
    check = (
        "import json, sys\n"
        "from aiperf.dataset.loader.models import SingleTurn\n"
        "rows = [SingleTurn.model_validate(json.loads(l)) for l in open(sys.argv[1])]\n"
        "print(len(rows), sum(r.output_length for r in rows), [r.timestamp for r in rows])\n"
    )
    run = subprocess.run(
        [AIPERF_PYTHON, "-c", check, str(tmp_path / "single.jsonl")], capture_output=True, text=True
    )
    assert run.returncode == 0 and run.stdout.strip() == "6 437 [0, 250, 900, 1500, 1500, 3001]", run.stderr
