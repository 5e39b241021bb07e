"""Every command that sends to a target reads its key alike: --api-key, then $REPLAYPROXY_API_KEY
(check's older $REPLAYPROXY_CHECK_API_KEY too), then $OPENAI_API_KEY; a refusal names them all.

Against a simulated engine that answers 401 on /v1 without the key: replay, compare, check and
sweep (whose replay steps are child processes: the key reaches them through the environment, not
their argument vectors) and tune (which starts the engine itself).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from replayproxy import config
from replayproxy.results import load_results
from replayproxy.shape import RequestShape
from tests.cli import CliResult, run_cli
from tests.replay import traces
from tests.servers import Server, sim

pytestmark = pytest.mark.slow

SECRET = "sk-test-shared-key-0123456789"
NAMES = ("REPLAYPROXY_API_KEY", "REPLAYPROXY_CHECK_API_KEY", "OPENAI_API_KEY")
SOURCES = "--api-key, $REPLAYPROXY_API_KEY or $OPENAI_API_KEY"


def test_the_flag_wins_then_our_variable_then_check_s_alias_then_openai_s() -> None:
    every = {"REPLAYPROXY_API_KEY": "ours", "REPLAYPROXY_CHECK_API_KEY": "check", "OPENAI_API_KEY": "sdk"}
    assert config.api_key("flag", every) == "flag"
    assert config.api_key(None, every) == "ours"
    assert config.api_key("", {**every, "REPLAYPROXY_API_KEY": ""}) == "check"
    assert config.api_key(None, {"OPENAI_API_KEY": "sdk"}) == "sdk"
    assert config.api_key(None, {}) == ""
    assert config.api_key_environment(None) is None
    assert (config.api_key_environment("k") or {})["REPLAYPROXY_API_KEY"] == "k"


@pytest.fixture(scope="module")
def guarded() -> Iterator[Server]:
    with sim("--api-key", SECRET, "--speed", "20") as server:
        yield server


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shapes = [
        RequestShape(i * 50_000_000, model=traces.SIM_MODEL, input_tokens=30, output_tokens=3, roles="u")
        for i in range(4)
    ]
    return traces.write(tmp_path_factory.mktemp("keys") / "t.rpt", shapes)


def cli(*args: str, env: dict[str, str | None] | None = None) -> CliResult:
    """The command with none of the key variables set unless `env` sets one."""
    return run_cli(*args, env={**dict.fromkeys(NAMES), **(env or {})})


def refused_naming_the_sources(done: CliResult) -> None:
    assert done.returncode == 2, done.stderr
    assert SOURCES in done.stderr and SECRET not in done.stderr


def with_key(how: str) -> tuple[list[str], dict[str, str | None]]:
    """(extra arguments, environment) giving the key the way `how` says."""
    return ([], {how: SECRET}) if how in NAMES else (["--api-key", SECRET], {})


@pytest.mark.parametrize("how", ["--api-key", "REPLAYPROXY_API_KEY", "OPENAI_API_KEY"])
def test_replay(guarded: Server, trace: Path, tmp_path: Path, how: str) -> None:
    argv = ["replay", str(trace), "--target", guarded.url, "--flavor", "vllm", "--quiet", "--no-calibrate"]
    refused_naming_the_sources(cli(*argv, "-o", str(tmp_path / "no.rpr")))
    extra, env = with_key(how)
    done = cli(*argv, "-o", str(tmp_path / "r.rpr"), *extra, env=env)
    assert done.returncode == 0, done.stderr
    assert load_results([tmp_path / "r.rpr"])[0].footer["summary"]["errors"] == 0


@pytest.mark.parametrize(
    "how", ["--api-key", "REPLAYPROXY_API_KEY", "REPLAYPROXY_CHECK_API_KEY", "OPENAI_API_KEY"]
)
def test_check(guarded: Server, tmp_path: Path, how: str) -> None:
    argv = ["check", "--target", f"a={guarded.url}", "--target", f"b={guarded.url}", "--builtin"]
    argv += ["--repeat", "1", "--warmup", "0", "--max-tokens", "4", "--quiet"]
    refused_naming_the_sources(cli(*argv, "-o", str(tmp_path / "no.rpc")))
    extra, env = with_key(how)
    done = cli(*argv, "-o", str(tmp_path / "c.rpc"), *extra, env=env)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("how", ["--api-key", "REPLAYPROXY_API_KEY"])
def test_compare(guarded: Server, trace: Path, tmp_path: Path, how: str) -> None:
    argv = ["compare", str(trace), "--target", f"a={guarded.url}", "--target", f"b={guarded.url}"]
    argv += ["--repeat", "1", "--warmup", "0", "--quiet", "-o"]
    refused_naming_the_sources(cli(*argv, str(tmp_path / "no"), "--replay-args", "--flavor", "vllm"))
    extra, env = with_key(how)
    done = cli(*argv, str(tmp_path / "runs"), *extra, "--replay-args", "--flavor", "vllm", env=env)
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "runs").glob("*.rpr"))) == 2


def test_sweep_hands_the_key_to_its_replay_steps_through_the_environment(
    guarded: Server, trace: Path, tmp_path: Path
) -> None:
    argv = ["sweep", str(trace), "--target", guarded.url, "--speeds", "1", "--quiet", "-o"]
    tail = ["--replay-args", "--flavor", "vllm", "--no-calibrate"]
    refused = cli(*argv, str(tmp_path / "no"), *tail)
    assert refused.returncode == 2 and SOURCES in refused.stderr, refused.stderr
    done = cli(*argv, str(tmp_path / "sweep"), "--api-key", SECRET, *tail)
    assert done.returncode == 0, done.stderr
    assert load_results([tmp_path / "sweep" / "speed-1.rpr"])[0].footer["summary"]["errors"] == 0


@pytest.mark.timeout(300)
def test_tune_hands_the_key_to_its_replays(trace: Path, tmp_path: Path) -> None:
    candidates = tmp_path / "candidates.toml"
    candidates.write_text(
        '[[engine]]\nname = "sim"\n'
        f'command = "{sys.executable} -m replayproxy.sim --port {{port}} --api-key {SECRET} '
        '--speed {speed}"\n'
        "grid = { speed = [20] }\n"
        'replay_args = ["--model", "sim-llama-3.1-8b", "--no-calibrate"]\n'
    )
    argv = ["tune", str(trace), "--candidates", str(candidates), "--slo", "ttft:p95<=5s", "--repeat", "1"]
    argv += ["--max-runs", "1", "--warmup", "0", "--no-final", "--api-key", SECRET, "-o", str(tmp_path / "t")]
    assert argv[-4] == "--api-key"
    refused = cli(*argv[:-4], "-o", str(tmp_path / "no"))
    assert SOURCES in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    done = cli(*argv)
    assert done.returncode == 0, done.stderr
    runs = [r for r in (tmp_path / "t").rglob("*.rpr")]
    assert runs and all(load_results([r])[0].footer["summary"]["errors"] == 0 for r in runs)
