"""The engine model's qualitative behaviour, measured on the truth log of a real loopback server.

Bounds are generous on purpose (machines are noisy); the point is the direction and rough size of
each effect: queueing, batching, prefix hits and preemption show up in TTFT and ITL.
"""

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import pytest

from tests.sim.conftest import RunningSim
from tests.sim.helpers import chat_body, content_gaps_ns, first_content_ns, get, metric, read_truth

StartSim = Callable[..., RunningSim]
# serial: TTFT and ITL are the sim's own wall-clock timings, which a busy neighbour would distort
pytestmark = pytest.mark.serial


async def _send_all(url: str, bodies: Sequence[dict[str, Any]], interval_s: float) -> None:
    """Open-loop arrivals every `interval_s` (absolute deadlines), each stream read to its end."""

    async def one(session: aiohttp.ClientSession, body: dict[str, Any], at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()

    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(one(session, b, start + i * interval_s) for i, b in enumerate(bodies)))


def _run(sim: RunningSim, bodies: Sequence[dict[str, Any]], interval_s: float = 0.0) -> list[dict[str, Any]]:
    asyncio.run(_send_all(sim.url, bodies, interval_s))
    records = read_truth(sim.truth, len(bodies))
    assert len(records) == len(bodies) and all(r["status"] == 200 for r in records)
    return records


def _mean_ttft_s(records: list[dict[str, Any]]) -> float:
    return float(statistics.mean(first_content_ns(r) - r["arrival_ns"] for r in records)) / 1e9


def _streams(n: int, max_tokens: int, text: str = "request {i} with a modest prompt") -> list[dict[str, Any]]:
    return [
        chat_body(text.format(i=i), max_tokens=max_tokens, ignore_eos=True, stream=True) for i in range(n)
    ]


def test_ttft_grows_with_the_arrival_rate(start_sim: StartSim) -> None:
    config = {"speed": 2.0, "max_num_seqs": 2}  # ~95 ms per request, 2 at a time: ~20 requests/s capacity
    slow = _mean_ttft_s(_run(start_sim(**config), _streams(16, 30), interval_s=0.125))
    fast = _mean_ttft_s(_run(start_sim(**config), _streams(16, 30), interval_s=0.125 / 4))
    assert fast > 2 * slow, (slow, fast)


def test_ttft_grows_with_prompt_length(start_sim: StartSim) -> None:
    short = _run(start_sim(speed=2.0), _streams(1, 2, "short prompt"))
    long = _run(start_sim(speed=2.0), _streams(1, 2, "a much longer prompt " * 600))
    assert _mean_ttft_s(long) > 2 * _mean_ttft_s(short)


def test_itl_grows_with_the_batch_size(start_sim: StartSim) -> None:
    def mean_itl_s(records: list[dict[str, Any]]) -> float:
        return statistics.mean(g for r in records for g in content_gaps_ns(r)) / 1e9

    single = mean_itl_s(_run(start_sim(), _streams(1, 40)))
    batch = mean_itl_s(_run(start_sim(), _streams(32, 40)))
    # Modelled: 6 + 1 * 0.12 ms per step alone, 6 + 32 * 0.12 ms with 32 streams (x1.6).
    assert batch > 1.2 * single, (single, batch)


def test_prefix_cache_lowers_ttft_of_a_prefix_heavy_load(start_sim: StartSim) -> None:
    shared = "You are a careful assistant who answers in full sentences. " * 120
    bodies = [
        {
            **chat_body(f"question {i}", max_tokens=2, stream=True),
            "messages": [{"role": "system", "content": shared}, {"role": "user", "content": f"question {i}"}],
        }
        for i in range(12)
    ]
    on = _run(start_sim(speed=2.0), bodies, interval_s=0.06)
    off = _run(start_sim(speed=2.0, prefix_cache=False), bodies, interval_s=0.06)
    assert sum(r["cached_tokens"] for r in on) > 0 and sum(r["cached_tokens"] for r in off) == 0
    assert _mean_ttft_s(on) < 0.6 * _mean_ttft_s(off), (_mean_ttft_s(on), _mean_ttft_s(off))


def test_scarce_kv_blocks_cause_preemptions_but_every_token_arrives(start_sim: StartSim) -> None:
    scarce = start_sim(speed=20.0, num_gpu_blocks=48, max_model_len=700)
    records = _run(scarce, _streams(8, 200))
    assert metric(get(scarce.url + "/metrics")[1].decode(), "vllm:num_preemptions_total") > 0
    assert [r["completion_tokens"] for r in records] == [200] * 8
    plenty = start_sim(speed=20.0)
    _run(plenty, _streams(8, 200))
    assert metric(get(plenty.url + "/metrics")[1].decode(), "vllm:num_preemptions_total") == 0
