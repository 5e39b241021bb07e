"""Replay against a server with llama.cpp's connection habits: it closes the connection after each
streamed response and drops idle keep-alive connections beyond its HTTP threads, while every
response says keep-alive. Probes must retry on a fresh connection (or exactness would be lost) and
no trace request may be lost as a reset.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from replayproxy.cli import main
from replayproxy.replay import probe_http
from replayproxy.results import load_results
from tests import servers
from tests.replay import traces

pytestmark = pytest.mark.slow
HABITS = ("--close-after-stream", "--http-threads", "4", "--keepalive-timeout", "1")


def test_probes_retry_on_a_fresh_connection_when_the_server_dropped_the_pooled_one() -> None:
    async def probe(url: str) -> list[int]:
        async with probe_http.session(30.0) as http:
            statuses = [(await probe_http.request(http, "GET", f"{url}/v1/models", {}))[0]]
            body = b'{"model":"sim-llama-3.1-8b","prompt":"a b","max_tokens":1,"stream":true}'
            # a streamed answer: the server closes that connection after it, keep-alive or not
            statuses.append((await probe_http.request(http, "POST", f"{url}/v1/completions", {}, body))[0])
            statuses.append((await probe_http.request(http, "GET", f"{url}/v1/models", {}))[0])
            return statuses

    with servers.sim(*HABITS) as sim:
        assert asyncio.run(probe(sim.url)) == [200, 200, 200]


@pytest.mark.parametrize("stream", [True, False])
def test_replay_stays_exact_with_no_reset(
    tmp_path: Path, bpe_tokenizer: Path, stream: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = traces.prefix_heavy(
        tmp_path / "chat.rpt",
        "chat",
        model=traces.SIM_MODEL,
        requests=100,
        rate_rps=20.0,
        stream_share=1.0 if stream else 0.0,
    )
    out = tmp_path / "run.rpr"
    with servers.sim("--tokenizer", str(bpe_tokenizer), "--speed", "20", *HABITS) as sim:
        assert main(["replay", str(trace), "--target", sim.url, "-o", str(out), "--quiet"]) == 0
    capsys.readouterr()
    run = load_results([out])[0]
    summary = run.footer["summary"]
    assert run.header.pre_run["prompts"]["lengths"] == "exact"
    assert summary["errors"] == 0, run.column("error_message")
    assert summary["input_exact"] == 1.0 and summary["output_exact"] == 1.0
    if stream:  # every stream's connection is closed by the server; the pool opens the next ahead
        assert run.column("new_connection").sum() <= 30
