"""Engine processes: started on a free port, healthy before use, and always stopped with their group."""

from __future__ import annotations

import json
import shlex
import sys
import urllib.request
from pathlib import Path

import pytest

from replayproxy.tune.candidates import parse_candidates
from replayproxy.tune.engine import EngineFailed, running
from tests.processes import survivors

SIM = f"{sys.executable} -m replayproxy.sim --port {{port}}"


def _config(command: str, **engine: object):  # type: ignore[no-untyped-def]
    (e,) = parse_candidates({"engine": [{"name": "e", "command": command, **engine}]}, "c")
    (config,) = e.configurations()
    return config


def _group_gone(pid: int) -> bool:
    return survivors([], groups=[pid]) == []


def test_an_engine_and_its_helpers_are_stopped_when_the_block_ends(tmp_path: Path) -> None:
    # The shell leaves a helper process behind in the engine's group, as vLLM's engine core would be.
    config = _config(f"sh -c 'sleep 300 & exec {SIM}'", stop_timeout=10)
    with running(config, tmp_path / "engine.log") as engine:
        assert engine.pid is not None and engine.command.startswith("sh -c")
        with urllib.request.urlopen(engine.url + "/v1/models", timeout=10) as answer:
            assert answer.status == 200
    assert _group_gone(engine.pid)


def test_an_engine_is_stopped_when_the_measurement_fails(tmp_path: Path) -> None:
    config = _config(SIM)
    pid = None
    with pytest.raises(RuntimeError, match="measurement broke"):
        with running(config, tmp_path / "engine.log") as engine:
            pid = engine.pid
            raise RuntimeError("measurement broke")
    assert pid is not None and _group_gone(pid)


def test_an_engine_that_exits_at_start_is_reported_with_its_status(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with pytest.raises(EngineFailed, match="exited with status 2 before it was healthy"):
        with running(_config(f"{SIM} --no-such-flag"), log):
            raise AssertionError("never healthy")
    assert "unrecognized arguments: --no-such-flag" in log.read_text()


def test_an_engine_that_never_turns_healthy_is_stopped_at_its_start_timeout(tmp_path: Path) -> None:
    config = _config(f"{SIM} --first-byte-delay 0", health="/no-such-path", start_timeout=3)
    with pytest.raises(
        EngineFailed, match="not healthy at .*/no-such-path within the start timeout .*HTTP 404"
    ):
        with running(config, tmp_path / "engine.log"):
            raise AssertionError("never healthy")


def test_a_command_that_cannot_run_is_one_clear_failure(tmp_path: Path) -> None:
    with pytest.raises(EngineFailed, match="cannot start"):
        with running(_config("/no/such/engine --port {port}"), tmp_path / "engine.log"):
            raise AssertionError("never started")


def test_each_knob_value_reaches_the_engine_as_exactly_one_argument(tmp_path: Path) -> None:
    """No shell runs and nothing is split after filling: what the engine gets is the value itself."""
    recorded = tmp_path / "argv.jsonl"
    engine = tmp_path / "engine.py"
    engine.write_text(
        "import json, os, sys\n"
        f"open({str(recorded)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "server = [sys.executable, '-m', 'http.server', sys.argv[2], '--bind', '127.0.0.1']\n"
        "os.execv(sys.executable, server)\n"
    )
    pwned = tmp_path / "pwned"
    hostile = [
        "two words",
        'it\'s "quoted"',
        f"x; touch {pwned}",
        f"a && touch {pwned}",
        f"$(touch {pwned})",
        f"`touch {pwned}`",
    ]
    command = (
        f"{shlex.quote(sys.executable)} {shlex.quote(str(engine))} --port {{port}} --v {{v}} --both=<{{v}}>"
    )
    (e,) = parse_candidates(
        {"engine": [{"name": "e", "command": command, "grid": {"v": hostile}, "health": "/"}]}, "c"
    )
    for config in e.configurations():
        with running(config, tmp_path / "engine.log") as started:
            assert started.pid is not None and shlex.split(started.command)[-3:] == [
                "--v", config.knobs["v"], f"--both=<{config.knobs['v']}>"
            ]  # fmt: skip
    got = [json.loads(line) for line in recorded.read_text().splitlines()]
    assert [argv[2:] for argv in got] == [["--v", v, f"--both=<{v}>"] for v in hostile]
    assert not pwned.exists()
