"""The step loop driven directly (no HTTP): token counts, limits, chunked prefill, cache, preemption."""

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from replayproxy.sim.config import SimConfig
from replayproxy.sim.engine import Engine, Seq
from replayproxy.sim.tasks import spawn

FAST: dict[str, Any] = {"speed": 50.0}


async def _drive(
    engine: Engine, requests: Sequence[tuple[list[int], int]], gap_s: float = 0.0, on_token: object = None
) -> list[Seq]:
    """Add requests (with `gap_s` between them), run the engine until all are done."""
    task = spawn(engine.run(), name="engine-under-test")
    all_done = asyncio.Event()
    seqs: list[Seq] = []

    def notify(seq: Seq) -> None:
        if callable(on_token):
            on_token(seq)
        if len(seqs) == len(requests) and all(s.done for s in seqs):
            all_done.set()

    try:
        for ids, n in requests:
            seqs.append(engine.add(ids, n, notify))
            if gap_s:
                await asyncio.sleep(gap_s)
        await asyncio.wait_for(all_done.wait(), 30)
    finally:
        task.cancel()
    return seqs


def _run(
    config: SimConfig, requests: Sequence[tuple[list[int], int]], **kwargs: object
) -> tuple[Engine, list[Seq]]:
    engine = Engine(config)
    seqs = asyncio.run(_drive(engine, requests, **kwargs))  # type: ignore[arg-type]
    return engine, seqs


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [100 + (offset + i) % 5000 for i in range(n)]


def test_every_sequence_gets_exactly_its_tokens_and_all_blocks_come_back() -> None:
    config = SimConfig(**FAST)
    engine, seqs = _run(config, [(_prompt(30 + i, i * 7), 5 + i) for i in range(12)])
    assert [s.generated for s in seqs] == [5 + i for i in range(12)]
    assert engine.stats.generation_tokens == sum(5 + i for i in range(12))
    assert engine.stats.prompt_tokens == sum(30 + i for i in range(12))
    assert engine.pool.available == config.num_gpu_blocks and not engine.running and not engine.waiting


def test_running_batch_never_exceeds_max_num_seqs() -> None:
    peak = 0

    def watch(seq: Seq) -> None:
        nonlocal peak
        peak = max(peak, len(engine.running))

    engine = Engine(SimConfig(max_num_seqs=3, **FAST))
    asyncio.run(_drive(engine, [(_prompt(20, i), 10) for i in range(10)], on_token=watch))
    assert peak == 3


def test_long_prompts_are_prefilled_in_chunks_under_the_token_budget() -> None:
    engine, seqs = _run(SimConfig(max_num_batched_tokens=256, **FAST), [(_prompt(1000), 1)])
    assert engine.stats.steps == 4  # ceil(1000 / 256) prefill steps, the last one yields the token


@pytest.mark.serial  # wall-clock step durations
def test_step_durations_follow_the_cost_model() -> None:
    config = SimConfig(step_base_ms=2.0, per_prefill_token_ms=0.1, per_decode_seq_ms=1.0)
    start = time.perf_counter()
    _run(config, [(_prompt(200), 40)])
    elapsed = time.perf_counter() - start
    expected = (2.0 + 200 * 0.1) + 39 * (2.0 + 1.0)  # one prefill step, then 39 decode steps (ms)
    assert expected / 1000 * 0.9 < elapsed < expected / 1000 * 3 + 0.5


def test_prefix_cache_serves_whole_shared_blocks_and_can_be_disabled() -> None:
    prompt = _prompt(100)
    on, seqs = _run(SimConfig(**FAST), [(prompt, 2), (prompt, 2), (prompt[:64], 2)], gap_s=0.05)
    assert [s.cached_tokens for s in seqs] == [0, 96, 48]  # at least one prompt token is always computed
    assert on.stats.prefix_hits == 96 + 48 and on.stats.prefix_queries == 264
    off, seqs = _run(SimConfig(prefix_cache=False, **FAST), [(prompt, 2), (prompt, 2)], gap_s=0.05)
    assert [s.cached_tokens for s in seqs] == [0, 0] and off.stats.prefix_hits == 0


def test_reset_prefix_cache_forgets_released_blocks() -> None:
    prompt = _prompt(100)

    async def scenario() -> list[Seq]:
        engine = Engine(SimConfig(**FAST))
        first = await _drive(engine, [(prompt, 2)])
        assert engine.reset_prefix_cache() == 6
        return first + await _drive(engine, [(prompt, 2)])

    assert [s.cached_tokens for s in asyncio.run(scenario())] == [0, 0]


def test_scarce_kv_blocks_preempt_the_newest_and_recompute_it() -> None:
    config = SimConfig(num_gpu_blocks=40, max_model_len=600, **FAST)
    engine, seqs = _run(config, [(_prompt(60, i * 100), 150) for i in range(6)])
    assert engine.stats.preemptions > 0
    assert sum(s.preemptions for s in seqs) == engine.stats.preemptions
    assert seqs[0].preemptions == 0  # the oldest is never the victim while newer ones run
    assert all(s.generated == 150 for s in seqs)
    assert engine.pool.available == config.num_gpu_blocks


def test_abort_frees_a_running_sequence() -> None:
    async def scenario() -> tuple[Engine, Seq]:
        engine = Engine(SimConfig(**FAST))
        task = spawn(engine.run(), name="engine-under-test")
        victim = engine.add(_prompt(50), 10_000, lambda s: None)
        while victim.generated < 3:
            await asyncio.sleep(0.001)
        engine.abort(victim)
        await asyncio.sleep(0.01)
        task.cancel()
        return engine, victim

    engine, victim = asyncio.run(scenario())
    assert victim.aborted and victim.generated < 10_000
    assert not engine.running and engine.pool.available == engine.pool.num_blocks
