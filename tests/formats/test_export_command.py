"""`replayproxy export`: every format from the table, command lines printed next to the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replayproxy import cli
from replayproxy.formats.registry import exporters
from tests.formats.helpers import conversation_trace


def test_help_lists_the_export_formats() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "replayproxy", "export", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert all(f"  {name}" in out.stdout for name in exporters())


@pytest.mark.parametrize("fmt", sorted(exporters()))
def test_every_export_format_writes_its_file(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = conversation_trace(tmp_path / "t.rpt")
    out = tmp_path / f"out-{fmt}.jsonl"
    assert cli.main(["export", str(trace), "--format", fmt, "-o", str(out), "--model", "m1"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote 6 requests to {out} ({fmt})" in printed and out.stat().st_size > 0
    if fmt == "mooncake":
        assert (
            "aiperf profile --model m1" in printed
            and "vllm bench serve" in printed
            and "guidellm run" in printed
        )


def test_vllm_custom_prompts_are_the_replayers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = conversation_trace(tmp_path / "t.rpt")
    out = tmp_path / "custom.jsonl"
    assert cli.main(["export", str(trace), "-f", "vllm-custom", "-o", str(out)]) == 0
    prompts = [json.loads(line)["prompt"].split() for line in out.read_text().splitlines()]
    assert [len(p) for p in prompts] == [1329, 1106, 1489, 4, 2047, 2647]  # input_tokens - 1 template token
    assert prompts[0][:1024] == prompts[1][:1024] and prompts[0][1030:1100] != prompts[1][1030:1100]
    assert prompts[4] == prompts[5][:2047]
    assert "--custom-output-len 30 " in capsys.readouterr().out  # median of 40, 10, 60, 7, 300, 20


def test_vllm_custom_prompts_are_exact_for_a_given_tokenizer(tmp_path: Path, bpe_tokenizer: Path) -> None:
    from replayproxy.replay.hf_tokenizer import LocalTokenizer
    from replayproxy.trace import load

    trace = conversation_trace(tmp_path / "t.rpt")
    out = tmp_path / "custom.jsonl"
    assert (
        cli.main(
            ["export", str(trace), "-f", "vllm-custom", "-o", str(out), "--tokenizer", str(bpe_tokenizer)]
        )
        == 0
    )
    prompts = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    counts = [len(ids) for ids in LocalTokenizer(bpe_tokenizer).encode_text_now(prompts)]
    assert counts == load(trace).input_tokens.tolist()


def test_empty_or_missing_traces_fail_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export", str(tmp_path / "none.rpt"), "-f", "csv", "-o", str(tmp_path / "x.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_unknown_format_lists_the_choices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = conversation_trace(tmp_path / "t.rpt")
    for fmt in ("sharegpt", "azure"):  # azure is import-only
        assert cli.main(["export", str(trace), "-f", fmt, "-o", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"replayproxy export: error: --format: invalid choice: {fmt!r}")
        assert err.count("\n") == 1 and ", ".join(sorted(exporters())) in err
    assert not (tmp_path / "x").exists()
