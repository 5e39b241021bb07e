"""`replayproxy replay` as users type it, against the real simulated engine: exit status, model names,
OpenAI-style base URLs and API keys, and the flags other benchmark tools taught them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayproxy.results import load_results
from replayproxy.shape import RequestShape
from replayproxy.trace.frames import ReadReport, iter_frame_payloads
from tests.cli import CliResult, run_cli
from tests.replay import traces
from tests.servers import Server, sim

pytestmark = pytest.mark.slow

SECRET = "sk-test-0123456789abcdef-do-not-record"


def small_trace(path: Path, model: str = traces.SIM_MODEL, requests: int = 20) -> Path:
    """`requests` chat requests 0.1 s apart (10 req/s over 1.9 s)."""
    shapes = [
        RequestShape(i * 100_000_000, model=model, input_tokens=40, output_tokens=4, roles="u")
        for i in range(requests)
    ]
    return traces.write(path, shapes)


def replay(*argv: str, env: dict[str, str] | None = None, verbose: bool = False) -> CliResult:
    """The command line's main, in-process, with no OPENAI_API_KEY unless the test sets one."""
    args = [*(["-v"] if verbose else []), "replay", "--flavor", "vllm", "--quiet", *argv]
    return run_cli(*args, env={"OPENAI_API_KEY": None, **(env or {})})


def replay_process(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real command line in a fresh interpreter, as a user (or a Kubernetes Job) runs it."""
    environ = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "replayproxy", "-v", "replay", "--flavor", "vllm", "--quiet", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **env},
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[Server]:
    with sim("--seed", "3") as server:
        yield server


def test_a_run_where_every_request_failed_exits_1_and_keeps_its_results(tmp_path: Path) -> None:
    trace, out = small_trace(tmp_path / "t.rpt"), tmp_path / "run.rpr"
    with sim("--fail-rate", "1.0") as failing:
        done = replay(str(trace), "--target", failing.url, "--no-calibrate", "-o", str(out))
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"replayproxy replay: all 20 requests failed (http_5xx 20) (results in {out})"
    assert len(load_results([out])[0]) == 20


def test_max_error_rate_decides_between_exit_0_and_1(tmp_path: Path) -> None:
    trace = small_trace(tmp_path / "t.rpt", requests=30)
    with sim("--fail-rate", "0.3", "--seed", "5") as flaky:
        lenient = replay(str(trace), "--target", flaky.url, "-o", str(tmp_path / "a.rpr"),
                         "--no-calibrate", "--max-error-rate", "0.9")  # fmt: skip
        strict = replay(str(trace), "--target", flaky.url, "-o", str(tmp_path / "b.rpr"),
                        "--no-calibrate", "--max-error-rate", "0")  # fmt: skip
    errors = load_results([tmp_path / "b.rpr"])[0].footer["summary"]["errors"]
    assert 0 < errors < 30
    assert lenient.returncode == 0, lenient.stderr
    assert strict.returncode == 1 and "more than --max-error-rate 0" in strict.stderr


def test_a_model_the_target_does_not_serve_becomes_its_only_model_in_one_line(
    tmp_path: Path, engine: Server
) -> None:
    trace, out = small_trace(tmp_path / "t.rpt", model="synth"), tmp_path / "run.rpr"
    done = replay(str(trace), "--target", engine.url, "-o", str(out))
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "not served" in line]
    assert len(notes) == 1 and f"using '{traces.SIM_MODEL}'" in notes[0] and "--model" in notes[0]
    assert load_results([out])[0].footer["summary"]["errors"] == 0


def test_an_explicit_model_the_target_does_not_serve_is_refused_with_the_served_list(
    tmp_path: Path, engine: Server
) -> None:
    trace = small_trace(tmp_path / "t.rpt")
    done = replay(str(trace), "--target", engine.url, "--model", "gpt-x", "-o", str(tmp_path / "r.rpr"))
    assert done.returncode == 2
    served = traces.SIM_MODEL
    assert done.stderr.strip() == (
        f"replayproxy replay: error: --model 'gpt-x' is not served by the target; it serves: {served}"
    )


def test_an_openai_style_base_url_and_the_aliases_users_know(tmp_path: Path, engine: Server) -> None:
    trace, out = small_trace(tmp_path / "t.rpt"), tmp_path / "run.rpr"
    done = replay(str(trace), "--base-url", f"{engine.url}/v1", "--num-prompts", "8",
                  "--request-rate", "40", "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = load_results([out])[0]
    assert len(result) == 8 and result.footer["summary"]["errors"] == 0
    # 8 requests 0.1 s apart at 40 req/s on average: 4x the recorded speed, 25 ms apart.
    assert result.header.options["speed"] == pytest.approx(4.0)
    scheduled = sorted(result.column("scheduled_ns").tolist())
    assert scheduled[-1] - scheduled[0] == pytest.approx(7 * 25_000_000, rel=0.01)


def test_request_rate_and_speed_together_are_one_error(tmp_path: Path) -> None:
    trace = small_trace(tmp_path / "t.rpt")
    done = replay(str(trace), "--target", "http://127.0.0.1:9", "--speed", "2", "--request-rate", "5",
                  "-o", str(tmp_path / "r.rpr"))  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "replayproxy replay: error: --request-rate and --speed both set the timing; give one"
    )


@pytest.mark.parametrize("how", ["flag", "OPENAI_API_KEY"])
def test_the_api_key_reaches_the_target_and_nothing_else(tmp_path: Path, how: str) -> None:
    trace, out = small_trace(tmp_path / "t.rpt"), tmp_path / "run.rpr"
    with sim("--api-key", SECRET) as guarded:
        refused = replay(str(trace), "--target", guarded.url, "-o", str(tmp_path / "no.rpr"))
        given = ["--api-key", SECRET] if how == "flag" else []
        if how == "OPENAI_API_KEY":  # inherited by a real process, as a Job's environment is
            done: CliResult | subprocess.CompletedProcess[str] = replay_process(
                str(trace), "--target", guarded.url, "-o", str(out), env={"OPENAI_API_KEY": SECRET}
            )
        else:
            done = replay(str(trace), "--target", guarded.url, "-o", str(out), *given, verbose=True)
    assert refused.returncode == 2 and "API key" in refused.stderr and SECRET not in refused.stderr
    assert done.returncode == 0, done.stderr
    assert load_results([out])[0].footer["summary"]["errors"] == 0
    assert SECRET not in done.stdout + done.stderr + "\n".join(guarded.output)
    data = out.read_bytes()
    decoded = b"".join(bytes(p) for p in iter_frame_payloads(data, str(out), ReadReport()))
    assert decoded and SECRET.encode() not in data + decoded


def test_without_a_terminal_progress_is_a_line_every_ten_seconds(tmp_path: Path, engine: Server) -> None:
    trace = traces.write(tmp_path / "t.rpt", [
        RequestShape(i * 500_000_000, model=traces.SIM_MODEL, input_tokens=40, output_tokens=4, roles="u")
        for i in range(25)
    ])  # fmt: skip
    args = [str(trace), "--target", engine.url, "-o", str(tmp_path / "r.rpr"), "--no-calibrate"]
    done = run_cli("replay", "--flavor", "vllm", *args)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("replay: ")]
    assert len(lines) == 2, done.stderr  # at 10 s, and the last one at the end
    first = r"replay: 0:1\d elapsed, ETA 0:0\d  sent 2\d/25  done \d+  in flight \d+  errors 0"
    assert re.match(first, lines[0]), lines[0]
    assert "TTFT p50" in lines[0] and "lag p99" in lines[0] and "\x1b" not in done.stderr
    assert lines[1].startswith("replay: 0:1") and "done 25" in lines[1] and "ETA 0:00" in lines[1]
    quiet = run_cli("replay", "--flavor", "vllm", *args, "--progress", "none", "--limit", "3")
    assert quiet.returncode == 0 and "replay: " not in quiet.stderr
