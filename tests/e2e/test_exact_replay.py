"""Exact workload end to end: the sim counting with a real BPE tokenizer, the replayer through its /tokenize.

Lengths must be exact request by request, and the sim's prefix-cache hits must match what the
trace implies at the sim's block size. With REPLAYPROXY_REAL_ENGINE=URL the same checks run
against a real engine (e.g. ../shared/real-engine/start.sh's vLLM); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.results import load_results
from replayproxy.trace import load
from replayproxy.workload_stats import workload_stats
from tests import conversations, servers
from tests.replay import traces

# serial: the engine's cache hits match the implied ones only while a donor's prefill keeps pace
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def _trace(tmp_path: Path, endpoint: str, model: str) -> Path:
    return traces.prefix_heavy(tmp_path / f"{endpoint}.rpt", endpoint, model=model, requests=80, rate_rps=8.0)


def _check(tmp_path: Path, url: str, model: str, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    _check_run(tmp_path, _trace(tmp_path, endpoint, model), url, endpoint, capsys)


def _check_run(
    tmp_path: Path, trace: Path, url: str, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"{endpoint}.rpr"
    assert main(["replay", str(trace), "--target", url, "-o", str(out), "--quiet"]) == 0
    capsys.readouterr()
    run = load_results([out])[0]
    assert run.header.pre_run["prompts"]["lengths"] == "exact"
    assert run.footer["summary"]["errors"] == 0
    share = run.footer["summary"]["input_exact"]
    assert share >= (0.99 if endpoint == "chat" else 1.0), share
    assert run.footer["summary"]["output_exact"] == 1.0
    # one reuse figure for one trace: the replay's profile of its window is inspect's
    assert run.extras["trace_profile"][0]["prefix_reuse"] == workload_stats(load(trace))["prefix_reuse"]
    assert main(["report", str(out), "--json"]) == 0
    cache = json.loads(capsys.readouterr().out)["runs"][0]["prefix_cache"]
    assert cache["implied_hit_tokens"] > 0
    assert abs(cache["engine_hit_tokens"] / cache["implied_hit_tokens"] - 1) <= 0.01, cache


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_sim_with_a_bpe_tokenizer_gets_exact_lengths_and_the_implied_cache_hits(
    tmp_path: Path, bpe_tokenizer: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with servers.sim("--tokenizer", str(bpe_tokenizer), "--speed", "20") as sim:
        _check(tmp_path, sim.url, traces.SIM_MODEL, endpoint, capsys)


def test_recorded_multi_turn_trace_gets_the_implied_cache_hits(
    tmp_path: Path, bpe_tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Conversations with live replies recorded through the proxy, then replayed against a fresh sim."""
    with (
        servers.sim("--tokenizer", str(bpe_tokenizer), "--speed", "20") as engine,
        servers.start_proxy(engine.url, tmp_path / "traces") as proxy,
    ):
        asyncio.run(conversations.send(proxy.url, traces.SIM_MODEL))
    recorded = sorted((tmp_path / "traces").glob("*.rpt"))
    assert recorded and len(load(recorded)) == 36
    with servers.sim("--tokenizer", str(bpe_tokenizer), "--speed", "20") as sim:
        _check_run(tmp_path, recorded[0], sim.url, "chat", capsys)


@pytest.mark.skipif(not os.environ.get("REPLAYPROXY_REAL_ENGINE"), reason="set REPLAYPROXY_REAL_ENGINE=URL")
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_real_engine_gets_exact_lengths_and_the_implied_cache_hits(
    tmp_path: Path, endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = os.environ["REPLAYPROXY_REAL_ENGINE"]
    _check(tmp_path, url, os.environ.get("REPLAYPROXY_REAL_MODEL", "tiny-llama"), endpoint, capsys)
