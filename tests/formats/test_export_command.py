"""`replayproxy export`: every format from the table, command lines printed next to the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayproxy import cli
from replayproxy.formats import export_command
from replayproxy.formats.export_command import FIELDS_READ
from replayproxy.formats.registry import exporters
from tests.cli import run_cli
from tests.formats.helpers import conversation_trace, shape, tokens, write


def test_help_lists_the_export_formats() -> None:
    out = run_cli("export", "--help")
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
    for fmt in ("sharegpt",):
        assert cli.main(["export", str(trace), "-f", fmt, "-o", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"replayproxy export: error: --format: invalid choice: {fmt!r}")
        assert err.count("\n") == 1 and ", ".join(sorted(exporters())) in err
    assert not (tmp_path / "x").exists()


def failed_trace(path: Path) -> Path:
    """Four served requests and two that failed at the source (a 5xx, and no answer at all)."""
    shapes = [
        shape(0, tokens(("a", 40)), 10),
        shape(10, tokens(("b", 40)), 0, status=503, error="http_5xx"),
        shape(20, tokens(("c", 40)), 12),
        shape(30, tokens(("d", 40)), 0, status=0, error="timeout"),
        shape(40, tokens(("e", 40)), 14),
        shape(50, tokens(("f", 40)), 16),
    ]
    return write(path, shapes)


@pytest.mark.parametrize("fmt", ["mooncake", "bailian", "jsonl"])
def test_failed_requests_are_left_out_and_counted(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, out = failed_trace(tmp_path / "t.rpt"), tmp_path / "out.jsonl"
    assert cli.main(["export", str(trace), "-f", fmt, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrote 4 requests" in printed and "left out 2 requests that failed" in printed
    assert len(out.read_text().splitlines()) == 4
    assert cli.main(["export", str(trace), "-f", fmt, "-o", str(out), "--include-failed"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and "left out" not in capsys.readouterr().out
    if fmt != "jsonl":
        assert [r["output_length"] for r in rows] == [10, 1, 12, 1, 14, 16]  # never 0: vLLM refuses it


def test_tables_keep_failed_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert cli.main(["export", str(failed_trace(tmp_path / "t.rpt")), "-f", "csv", "-o", str(out)]) == 0
    assert "wrote 6 requests" in capsys.readouterr().out


def test_commands_name_the_traces_model_and_warn_about_a_mix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = write(tmp_path / "one.rpt", [shape(i, tokens(("x", 40)), 5, model="qwen-7b") for i in range(3)])
    assert cli.main(["export", str(one), "-f", "mooncake", "-o", str(tmp_path / "m.jsonl")]) == 0
    printed = capsys.readouterr().out
    assert "aiperf profile --model qwen-7b" in printed and "several models" not in printed
    mixed = [shape(i, tokens(("x", 40)), 5, model="qwen-7b" if i % 3 else "llama") for i in range(6)]
    trace = write(tmp_path / "mixed.rpt", mixed)
    assert cli.main(["export", str(trace), "-f", "mooncake", "-o", str(tmp_path / "m.jsonl")]) == 0
    assert "several models (qwen-7b 4, llama 2)" in capsys.readouterr().out


def test_printed_commands_keep_the_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Single-turn requests: AIPerf's Bailian loader would append linked turns again (see the next test).
    single = [shape(0, tokens(("a", 300)), 40), shape(250, tokens(("a", 300), ("b", 77)), 10)]
    trace = write(tmp_path / "t.rpt", single)
    for fmt in ("mooncake", "bailian"):
        assert cli.main(["export", str(trace), "-f", fmt, "-o", str(tmp_path / f"{fmt}.jsonl")]) == 0
        printed = capsys.readouterr().out
        aiperf = next(line for line in printed.splitlines() if line.startswith("AIPerf:"))
        vllm = next(line for line in printed.splitlines() if line.startswith("vLLM:"))
        assert "--extra-inputs ignore_eos:true" in aiperf  # else requests stop at EOS, output shrinks
        # timed_trace sends token-id prompts, which only a completions backend takes.
        assert "--backend openai --endpoint /v1/completions" in vllm and "openai-chat" not in vllm


def test_a_multi_turn_bailian_export_prints_no_aiperf_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = conversation_trace(tmp_path / "t.rpt")
    assert cli.main(["export", str(trace), "-f", "bailian", "-o", str(tmp_path / "b.jsonl")]) == 0
    aiperf = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("AIPerf:"))
    assert "not for this file (multi-turn)" in aiperf and "--sessions" in aiperf


@pytest.mark.parametrize(("fmt", "extra"), [(f, []) for f in FIELDS_READ] + [("mooncake", ["--sessions"])])
def test_exports_that_load_only_the_fields_they_read_write_the_same_bytes(
    tmp_path: Path, fmt: str, extra: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions, think times, failures, models, endpoints and request types all reach the file."""
    system = ("system", 100)
    shapes = [
        shape(0, tokens(system, ("q", 40)), 10, session=5, turn=0, model="m-a", request_type="text"),
        shape(10, tokens(system, ("q", 40), ("a", 10), ("r", 20)), 12, session=5, turn=1, think_ns=3_000_000),
        shape(20, tokens(("x", 30)), 0, max_tokens=64, status=500, error="upstream", model="m-b"),
        shape(30, tokens(system, ("y", 9)), -1, max_tokens=77, endpoint="completions", stream=False),
        shape(40, tokens(("z", 50)), 14, session=9, turn=2, e2e_ns=5_000_000, request_type="image"),
    ]
    trace = write(tmp_path / "t.rpt", shapes)
    for run in ("subset", "whole"):
        for failed in ([], ["--include-failed"]):
            out = tmp_path / f"{run}{len(failed)}.{fmt}"
            assert cli.main(["export", str(trace), "-f", fmt, "-o", str(out), *extra, *failed]) == 0
        monkeypatch.setattr(export_command, "FIELDS_READ", {})  # every field loaded
    for failed in (0, 1):
        assert (tmp_path / f"subset{failed}.{fmt}").read_bytes() == (
            tmp_path / f"whole{failed}.{fmt}"
        ).read_bytes()


README_SYNTH = [
    "--requests",
    "200",
    "--rate",
    "20",
    "--prefix-groups",
    "4",
    "--prefix-len",
    "256",
    "--seed",
    "1",
]


@pytest.mark.parametrize("fmt", ["mooncake", "bailian", "jsonl"])
def test_an_export_keeps_the_traces_sharing_or_warns_with_both_figures(tmp_path: Path, fmt: str) -> None:
    """The README's synthetic trace (16-token blocks, 256-token shared prefixes) went from 26.7 %
    reuse to 0 % through `export --format mooncake` and `import`, silently: 512-token ids are
    longer than its shared prefixes. By default the ids now follow the trace's block size."""
    source, out, back = tmp_path / "s.rpt", tmp_path / "s.jsonl", tmp_path / "back.rpt"
    assert run_cli("synth", "-o", str(source), *README_SYNTH).returncode == 0
    recorded = json.loads(run_cli("inspect", "--json", str(source)).stdout)["prefix_reuse"]
    assert recorded == pytest.approx(0.267, abs=0.001)
    done = run_cli("export", str(source), "--format", fmt, "-o", str(out))
    assert done.returncode == 0 and done.stderr == ""
    command = next(line for line in done.stdout.splitlines() if "replayproxy import" in line)
    assert "--block-size 16" in command
    if fmt != "jsonl":  # the consumers' commands say the same size
        assert "--isl-block-size 16" in done.stdout or "--timed-trace-chunk-hash-size 16" in done.stdout
    assert run_cli("import", str(out), "--format", fmt, "--block-size", "16", "-o", str(back)).returncode == 0
    again = json.loads(run_cli("inspect", "--json", str(back)).stdout)["prefix_reuse"]
    assert again == pytest.approx(recorded, abs=0.01)
    lost = run_cli("export", str(source), "--format", fmt, "--block-size", "512", "-o", str(out))
    assert lost.returncode == 0
    assert lost.stderr.strip().splitlines() == [
        f"replayproxy export: warning: prefix reuse is 0.0% in the export with 512-token ids, {recorded:.1%}"
        " in the trace; --block-size 16 (the trace's block size) keeps it"
    ]
    close = run_cli("export", str(source), "--format", fmt, "--block-size", "32", "-o", str(out))
    assert close.returncode == 0 and close.stderr == ""  # 32-token ids still cover 256-token prefixes
