"""The `replayproxy replay` command: one-line errors, config merging, and an interrupted run."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.replay import arguments
from replayproxy.report.document import build_document
from replayproxy.report.runs import load_runs
from replayproxy.results import load_results
from replayproxy.shape import RequestShape
from tests.replay import traces
from tests.replay.sse_server import Server, in_thread, sse_answer

MODELS = b'HTTP/1.1 200 OK\r\nContent-Length: 25\r\n\r\n{"data":[{"id":"bench"}]}'


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    arguments.add_arguments(parser)
    return parser.parse_args(argv)


def test_options_merge_file_and_command_line(tmp_path: Path) -> None:
    config = tmp_path / "r.toml"
    config.write_text('[replay]\ntarget = "http://t:1"\nspeed = 3.0\nmodel_map = { a = "b" }\nseed = 4\n')
    options = arguments.options_from_args(
        parse(["x.rpt", "-o", "o.rpr", "--config", str(config), "--seed", "9"])
    )
    assert (options.target, options.speed, options.model_map, options.seed) == (
        "http://t:1",
        3.0,
        {"a": "b"},
        9,
    )
    assert options.reset_prefix_cache and options.calibrate
    quiet = arguments.options_from_args(
        parse(["x.rpt", "--target", "http://t", "-o", "o", "--no-reset-prefix-cache"])
    )
    assert quiet.reset_prefix_cache is False
    assert "api_key" not in quiet.recorded()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["replay", "t.rpt", "-o", "o.rpr"], "--target is required"),
        (["replay", "missing.rpt", "--target", "http://127.0.0.1:9", "-o", "o.rpr"], "no such file"),
        (["replay", "t.rpt", "--target", "http://127.0.0.1:9", "-o", "o.rpr", "--speed", "0"], "speed"),
        (["replay", "t.rpt", "--target", "http://127.0.0.1:9", "-o", "o.rpr", "--shard", "3/2"], "shard"),
        (["replay", "t.rpt", "--target", "ftp://x", "-o", "o.rpr"], "http"),
        (["replay", "t.rpt", "--target", "http://127.0.0.1:9", "-o", "o.rpr"], "cannot reach target"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    traces.write(tmp_path / "t.rpt", [RequestShape(0, input_tokens=10, output_tokens=2, roles="u")])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replayproxy replay: error:") and message in err and "\n" not in err


@contextmanager
def slow_server(answered: list[int]) -> Iterator[Server]:
    """A server in a thread whose streams take half a second; `answered` counts the streams answered
    (the trace's requests, not the probes that describe the target first)."""

    async def respond(request: bytes, writer: asyncio.StreamWriter, _: int) -> None:
        if request.startswith(b"GET"):
            writer.write(MODELS)
            return
        await asyncio.sleep(0.5)
        writer.write(sse_answer(2))
        await writer.drain()
        if b"text/event-stream" in request:
            answered.append(1)

    with in_thread(respond) as server:
        yield server


@pytest.mark.parametrize(
    ("stop", "inherited"),
    [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_IGN)],
    ids=["ctrl-c", "sigterm, SIGINT ignored"],
)
def test_an_interrupted_run_keeps_its_results(
    tmp_path: Path, stop: signal.Signals, inherited: signal.Handlers
) -> None:
    """Ctrl-C, or SIGTERM (what stops a run whose SIGINT is ignored: a background job of a shell
    without job control, where a benchmark's Ctrl-C would leave the replay running for good)."""
    shapes = [
        RequestShape(i * 100_000_000, "completions", input_tokens=10, output_tokens=2) for i in range(60)
    ]
    trace = traces.write(tmp_path / "long.rpt", shapes)
    out = tmp_path / "partial.rpr"
    answered: list[int] = []
    with slow_server(answered) as server:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "replayproxy",
                "replay",
                str(trace),
                "--target",
                server.url,
                "-o",
                str(out),
                "--flavor",
                "vllm",
                "--allow-approximate",  # a bare server: no tokenize endpoint
                "--quiet",
            ],
            stderr=subprocess.PIPE,
            text=True,
            # A shell without job control starts background jobs with SIGINT ignored, and a child
            # inherits that (the test then failed whenever CI was started with `&`).
            preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
        )
        # Stopped once some requests were answered and others are still waiting for their answer,
        # however slow the start or the server on a busy machine (the trace lasts 6 s).
        for _ in range(1500):  # 30 s at most
            posted = sum(b"text/event-stream" in request for request in server.requests)
            if len(answered) >= 3 and posted - len(answered) >= 2:
                break
            time.sleep(0.02)
        seen = f"{posted} sent, {len(answered)} answered when stopped"
        process.send_signal(stop)
        _, err = process.communicate(timeout=20)
    assert process.returncode == 130, err
    assert "interrupted" in err
    result = load_results([out])[0]
    errors = result.column("error").tolist()
    assert 5 <= len(errors) < 60, seen
    assert "client_cancel" in errors and "" in errors, (seen, errors)
    assert result.footer["summary"]["partial"] is True and result.footer["summary"]["stopped_after_s"] > 0
    doc = build_document(load_runs([out]))
    run = doc["runs"][0]
    assert run["partial"]["cancelled"] == errors.count("client_cancel")
    assert "client_cancel" not in run["errors"]["by_class"]  # cut off by us, not failed by the engine
    assert run["requests"] == len(errors) - errors.count("client_cancel")
    assert any("partial run, interrupted after" in w for w in doc["warnings"])


def test_without_exact_prompts_replay_stops_naming_the_cause_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = traces.write(tmp_path / "t.rpt", [RequestShape(0, "chat", input_tokens=10, output_tokens=2)])
    with slow_server([]) as server:
        code = main(["replay", str(trace), "--target", server.url, "-o", str(tmp_path / "r.rpr"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "exact prompts cannot be built" in err[0] and "--tokenizer" in err[0]
    assert "--allow-approximate" in err[0]
    assert not (tmp_path / "r.rpr").exists()
