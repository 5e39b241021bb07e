"""An engine that quotes the request in its error bodies: none of that text reaches any output.

The sim's `--echo-reject-rate` answers 400 with the start of the request body in the message, as
many engines' validators do. Every output is searched for the quoted text: the result and check
files' decompressed frames, their csv/jsonl/parquet exports, reports, stdout and stderr (logs).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from replayproxy.results import load_checks, load_results
from replayproxy.trace import ReadReport
from replayproxy.trace.frames import iter_frame_payloads
from tests.cli import CliResult, run_cli
from tests.servers import sim

pytestmark = pytest.mark.slow

SECRET = "okapi-marmalade-7319"  # planted in the check's prompts, echoed back by the engine
ECHOED = (b"Invalid request", b'"messages"', b'"role"', SECRET.encode())


def _frames(path: Path) -> bytes:
    return b"".join(map(bytes, iter_frame_payloads(path.read_bytes(), str(path), ReadReport())))


def _text(done: CliResult) -> bytes:
    return (done.stdout + done.stderr).encode()


def _leaks(outputs: dict[str, bytes]) -> list[str]:
    return [f"{name}: {marker!r}" for name, data in outputs.items() for marker in ECHOED if marker in data]


def test_replay_keeps_the_error_type_not_the_echoed_request(tmp_path: Path) -> None:
    trace, rpr = tmp_path / "w.rpt", tmp_path / "run.rpr"
    synth = ["synth", "-o", str(trace), "--requests", "30", "--rate", "30", "--input-len", "fixed:60"]
    assert run_cli(*synth, "--output-len", "fixed:4", "--stream-share", "0.5", "--seed", "2").returncode == 0
    with sim("--speed", "20", "--echo-reject-rate", "0.5", "--seed", "5") as engine:
        replayed = run_cli("replay", str(trace), "--target", engine.url, "-o", str(rpr))
    assert rpr.exists(), replayed.stderr
    (loaded,) = load_results([rpr])
    errors = [
        str(m) for e, m in zip(loaded.column("error"), loaded.column("error_message"), strict=True) if e
    ]
    assert len(errors) >= 5 and set(errors) == {"HTTP 400 BadRequestError"}
    outputs = {"rpr frames": _frames(rpr), "replay output": _text(replayed)}
    for fmt in ("csv", "jsonl", "parquet"):
        out = tmp_path / f"rows.{fmt}"
        exported = run_cli("export", str(rpr), "--format", fmt, "-o", str(out))
        assert exported.returncode == 0, exported.stderr
        data = out.read_bytes() if fmt != "parquet" else orjson.dumps(pq.read_table(out).to_pylist())
        assert b"HTTP 400 BadRequestError" in data  # the export holds the field the test searches
        outputs[f"{fmt} export"] = data + _text(exported)
    for extra in ((), ("--json",)):
        outputs[f"report {' '.join(extra)}"] = _text(run_cli("report", str(rpr), *extra))
    assert _leaks(outputs) == []


def test_check_keeps_the_error_type_not_the_echoed_prompt(tmp_path: Path) -> None:
    prompts, rpc = tmp_path / "prompts.jsonl", tmp_path / "c.rpc"
    lines = [
        {"id": "chat", "messages": [{"role": "user", "content": f"Tell me about {SECRET}."}]},
        {"id": "completion", "prompt": f"Once upon a time {SECRET}"},
    ]
    prompts.write_bytes(b"\n".join(map(orjson.dumps, lines)) + b"\n")
    with sim("--speed", "20", "--echo-reject-rate", "1") as engine:
        checked = run_cli(
            "check", "--target", f"a={engine.url}", "--prompts", str(prompts), "-o", str(rpc), "--repeat", "1"
        )
    assert rpc.exists(), checked.stderr
    (loaded,) = load_checks([rpc])
    assert set(loaded.column("error_message")) == {"HTTP 400 BadRequestError"}
    outputs = {"rpc frames": _frames(rpc), "check output": _text(checked)}
    for extra in ((), ("--json",)):
        outputs[f"report {' '.join(extra)}"] = _text(run_cli("report", str(rpc), *extra))
    assert _leaks(outputs) == []
