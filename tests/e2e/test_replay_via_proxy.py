"""`replay --via-proxy`: the replay goes through a proxy in production's position, which records the
run's own trace, and the report's fidelity statement times the replay there, as production was."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from replayproxy.cli import main
from replayproxy.report.baseline import baseline_run
from replayproxy.trace import load
from tests.e2e.test_replay_cache_hits import SESSIONS, TURNS, recorded  # noqa: F401 — the fixture
from tests.e2e.test_replay_sim import replay
from tests.servers import sim

pytestmark = pytest.mark.slow


# Timing: the hop's sign compares two processes' clocks around one write; with both cores busy the
# replayer can be preempted between its write and its clock reading, longer than the hop itself.
@pytest.mark.serial
def test_the_replay_is_timed_at_a_proxy_like_production(
    recorded: Path,  # noqa: F811 — the fixture
    bpe_tokenizer: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    via = tmp_path / "via"
    with sim("--tokenizer", str(bpe_tokenizer), "--speed", "20") as engine:
        run = replay(recorded, engine.url, tmp_path / "r.rpr", "--via-proxy", str(via))
    assert run.header.options["via_proxy"] == str(via / "r")
    assert run.header.target == engine.url  # the result names the engine, not the proxy in front of it
    own = load(via / "r")  # the proxy's trace of the replay: every request, as it saw them
    assert len(own) == len(run) == SESSIONS * TURNS
    assert np.array_equal(np.sort(own.input_tokens), np.sort(run.column("prompt_tokens")))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r.rpr"), "--baseline", str(recorded), "--json"]) == 0
    [fidelity] = json.loads(capsys.readouterr().out)["fidelity"]
    ttft = fidelity["figures"][0]
    at_proxy = baseline_run(via / "r").measures
    assert ttft["replay_ms"] == pytest.approx(float(np.nanpercentile(at_proxy.ttft_ms, 50)))
    hop = next(d for d in fidelity["differences"] if d["name"] == "proxy hop")
    assert hop["size"].startswith("none: the replay went through a proxy")
    assert hop["value"] > 0  # the replayer sees each reply after the proxy forwarded it


def test_without_it_the_hop_is_named_unmeasured(
    recorded: Path,  # noqa: F811 — the fixture
    bpe_tokenizer: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sim("--tokenizer", str(bpe_tokenizer), "--speed", "20") as engine:
        replay(recorded, engine.url, tmp_path / "r.rpr")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r.rpr"), "--baseline", str(recorded), "--json"]) == 0
    [fidelity] = json.loads(capsys.readouterr().out)["fidelity"]
    hop = next(d for d in fidelity["differences"] if d["name"] == "proxy hop")
    assert hop["value"] is None and "--via-proxy" in hop["size"]
