"""Cold start per engine: llama.cpp's slot erase before each measured run where the server allows it
(--slot-save-path), else a run header that says "cache-warm" and a report that shows it on the
candidate with the fix. Against the sim taught llama.cpp's /slots, and opt-in against a real
llama-server (REPLAYPROXY_REAL_LLAMACPP=URL; start it with EXTRA="--slot-save-path DIR --cache-ram 0" for a
cold start, without --cache-ram 0 for an erase the report shows was not one, with neither for the
warm path).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import aiohttp
import pytest

from replayproxy.results import ReplayResult, load_results
from tests import servers
from tests.cli import run_cli
from tests.replay import traces

pytestmark = pytest.mark.slow
FIX = "cache-warm (erase_slots failed: HTTP 501; start llama-server with --slot-save-path DIR)"


def chat_trace(path: Path, model: str) -> Path:
    return traces.prefix_heavy(path, "chat", model=model, requests=24, rate_rps=20.0, stream_share=1.0)


def replay_twice(trace: Path, url: str, out: Path, *extra: str) -> list[ReplayResult]:
    """Two measured runs of the same trace, each after the flavor's pre-run actions."""
    argv = ["replay", str(trace), "--target", url, "-o", str(out), "--flavor", "llamacpp", "--quiet"]
    done = run_cli(*argv, "--repeat", "2", "--label", "llama", *extra)
    assert done.returncode == 0, done.stderr
    return load_results([out.with_name(f"{out.stem}-run{i}.rpr") for i in (1, 2)])


def first_cached(run: ReplayResult) -> int:
    """Cached prompt tokens of the run's first request: 0 after an emptied cache."""
    first = int(list(run.column("index")).index(0))
    return int(run.column("cached_tokens")[first])


@pytest.mark.parametrize("erasable", [True, False])
def test_slot_erase_before_each_run_or_the_run_says_cache_warm(
    tmp_path: Path, bpe_tokenizer: Path, erasable: bool
) -> None:
    trace = chat_trace(tmp_path / "chat.rpt", traces.SIM_MODEL)
    save = ["--slot-save-path", str(tmp_path / "slots")] if erasable else []
    options = ["--dialect", "llamacpp", "--tokenizer", str(bpe_tokenizer), "--speed", "20", *save]
    with servers.sim(*options) as sim:
        runs = replay_twice(trace, sim.url, tmp_path / "run.rpr", "--tokenizer", str(bpe_tokenizer))
    for run in runs:
        pre_run = run.header.pre_run
        assert pre_run["erase_slots"] == ("ok" if erasable else "failed: HTTP 501")
        assert pre_run["cache_start"] == ("cold" if erasable else "cache-warm")
    if erasable:  # the second run found the cache the first had filled emptied
        assert first_cached(runs[1]) == 0
    else:  # the second run's first request found its prefix from the first run
        assert first_cached(runs[1]) > 0
    report = run_cli("report", *(str(p) for p in sorted(tmp_path.glob("run-run*.rpr"))))
    assert report.returncode == 0, report.stderr
    assert (FIX in " ".join(report.stdout.split())) != erasable, report.stdout  # lines wrap at 100


REAL = os.environ.get("REPLAYPROXY_REAL_LLAMACPP", "").rstrip("/").removesuffix("/v1")


async def _erasable(url: str) -> bool:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/slots/0?action=erase") as resp:
        return resp.status == 200


@pytest.mark.skipif(not REAL, reason="REPLAYPROXY_REAL_LLAMACPP=URL of a real llama-server not set")
def test_against_the_real_llama_server(tmp_path: Path) -> None:
    erasable = asyncio.run(_erasable(REAL))
    trace = chat_trace(tmp_path / "chat.rpt", "any")
    runs = replay_twice(trace, REAL, tmp_path / "run.rpr")
    for run in runs:
        assert run.header.pre_run["erase_slots"] == ("ok" if erasable else "failed: HTTP 501")
        assert run.header.pre_run["cache_start"] == ("cold" if erasable else "cache-warm")
        assert run.footer["summary"]["input_exact"] == 1.0
    if not erasable:
        assert first_cached(runs[1]) > 0
    elif first_cached(runs[1]):  # erased, yet served from llama-server's host-memory prompt cache
        report = run_cli("report", str(tmp_path / "run-run2.rpr"))
        assert "llama: not a cold start" in report.stdout and "--cache-ram 0" in report.stdout, report.stdout
