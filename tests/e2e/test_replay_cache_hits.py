"""Replaying production's own trace against the same engine hits its prefix cache as production did.

Production is multi-turn chat from the openai SDK through the proxy in front of the sim, sessions
sharing a system prompt per group. The proxy hashes 64-character blocks, so sibling first turns
share a system prompt that ends inside a block none of them share whole; the replay must still
reuse as many tokens of it as production did (per request, the sim's `cached_tokens`).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import numpy as np
import pytest
from openai import AsyncOpenAI

from replayproxy.cli import main
from replayproxy.trace import load
from tests.e2e.test_replay_sim import replay
from tests.servers import sim, start_proxy

pytestmark = pytest.mark.slow

MODEL = "sim-llama-3.1-8b"
GROUPS, SESSIONS, TURNS = 4, 12, 3
WORDS = "the of and to in is that for it as with was on be by this are or from at which but not have".split()


async def production(url: str) -> None:
    """Sessions one after another, each turn the conversation so far plus a new user message."""
    rng = random.Random(7)
    systems = [" ".join(rng.choices(WORDS, k=rng.randint(150, 250))) for _ in range(GROUPS)]
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    for s in range(SESSIONS):
        messages = [{"role": "system", "content": systems[s % GROUPS]}]
        for _ in range(TURNS):
            messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 60)))})
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=32, stream=True,  # type: ignore[arg-type]
                stream_options={"include_usage": True},
            )  # fmt: skip
            text = "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
            messages.append({"role": "assistant", "content": text})
    await client.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path) -> Path:
    traces = tmp_path_factory.mktemp("cache-hits") / "trace"
    with sim("--tokenizer", str(bpe_tokenizer), "--speed", "20") as engine:
        with start_proxy(engine.url, traces, admin_listen="") as proxy:
            asyncio.run(production(proxy.url))
    return traces


@pytest.mark.parametrize("replies", ["live", "planned"])
def test_replay_reuses_the_prefix_cache_as_production_did(
    recorded: Path, bpe_tokenizer: Path, tmp_path: Path, replies: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cols = load(recorded)
    assert len(cols) == SESSIONS * TURNS and cols.headers[0].block_unit == "char"
    with sim("--tokenizer", str(bpe_tokenizer), "--speed", "20") as engine:
        run = replay(recorded, engine.url, tmp_path / "r.rpr", "--replies", replies)
    rows = run.column("index")
    replayed, produced = run.column("cached_tokens"), cols.cached_tokens[rows]
    first = cols.turn[rows] == 0
    siblings = first & (produced > 0)
    assert siblings.sum() == SESSIONS - GROUPS  # first turns after the first of their group hit its prompt
    # Per sibling within one 16-token block of production's: the part of the system prompt that no
    # full block covers is reused too, estimated as half a block (before, 16-32 tokens short each).
    # Where the prompt ends inside that block is not in the trace, so a group can be one block off.
    assert np.all(np.abs(replayed[siblings] - produced[siblings]) <= 16)
    assert abs(replayed[first].sum() / produced[first].sum() - 1) <= 0.05
    if replies == "live":  # later turns carry the sim's own replies, so their hits are production's
        assert abs(replayed.sum() / produced.sum() - 1) <= 0.01
    else:  # planned replies stand where the sim's replies stood: those blocks miss, and the report says why
        assert replayed[~first].sum() < produced[~first].sum()
        capsys.readouterr()
        assert main(["report", str(tmp_path / "r.rpr"), "--baseline", str(recorded), "--json"]) == 0
        [fidelity] = json.loads(capsys.readouterr().out)["fidelity"]
        hits = next(d for d in fidelity["differences"] if d["name"] == "prefix-cache hits")
        assert hits["value"] < -0.01 and "planned replies" in hits["size"]
