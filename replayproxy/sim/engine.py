"""The continuous-batching step loop: the part of the sim that makes latency behave like vLLM's.

Each step schedules running sequences first (decode: 1 token; unfinished prefill: a chunk), then
admits waiting ones FIFO while `max_num_seqs`, the step's token budget and KV blocks allow; when a
running sequence needs a block and none is left, the newest running sequence is preempted and later
recomputed. Like vLLM, every full block of known tokens is cached once computed, the generated
ones included, so the next turn of a conversation, which carries this reply, hits it. The step
then lasts `step_base + prefill_tokens * per_prefill_token + decode_seqs *
per_decode_seq` (divided by `speed`) of real time, and every sequence whose known tokens are all in
KV emits one token.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from replayproxy.sim.clock import now_ns, sleep_until
from replayproxy.sim.config import SimConfig
from replayproxy.sim.kv import BlockPool, block_hashes

# A late step may borrow this much from the next one, so timer overshoot does not accumulate.
_CATCH_UP_NS = 2_000_000
_RUN_NOISE_SALT = 0x5EED_0F_2E  # the run-noise draws differ from the seed's other draws


class Seq:
    """One request inside the engine; the server reads `generated` and `done` when `notify(seq)` is called."""

    __slots__ = (
        "prompt_len",
        "output_len",
        "hashes",
        "notify",
        "computed",
        "generated",
        "private",
        "held",
        "cached_tokens",
        "admitted",
        "done",
        "aborted",
        "preemptions",
        "arrival_ns",
        "first_token_ns",
        "prev_token_ns",
        "last_token_ns",
    )

    def __init__(
        self, prompt_len: int, output_len: int, hashes: list[int], notify: Callable[[Seq], None]
    ) -> None:
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.hashes = hashes  # chained hashes of the full blocks of prompt + output ([] without prefix cache)
        self.notify = notify
        self.computed = 0  # tokens whose KV exists
        self.generated = 0
        self.private = 0  # blocks owned alone
        self.held: list[int] = []  # cached blocks referenced
        self.cached_tokens = 0  # prompt tokens served from the prefix cache at first admission
        self.admitted = False
        self.done = False
        self.aborted = False
        self.preemptions = 0
        self.arrival_ns = now_ns()
        self.first_token_ns = 0
        self.prev_token_ns = 0
        self.last_token_ns = 0

    @property
    def blocks(self) -> int:
        return self.private + len(self.held)


class EngineObserver(Protocol):
    """Where per-token and per-request latencies go (sim.metrics implements it)."""

    def emitted(self, seq: Seq) -> None: ...

    def finished(self, seq: Seq) -> None: ...


@dataclass(slots=True)
class EngineStats:
    """Monotonic counters with vLLM's meaning: prefix queries and hits count tokens."""

    steps: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0


class Engine:
    """Runs as one task (`run`); `add` and `abort` are called from request handlers."""

    def __init__(self, config: SimConfig, observer: EngineObserver | None = None) -> None:
        self.config = config
        self.pool = BlockPool(config.num_gpu_blocks)
        self.stats = EngineStats()
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._observer = observer
        self._wake = asyncio.Event()
        self._deadline_ns = 0
        self._run_noise = random.Random(config.seed ^ _RUN_NOISE_SALT)
        self._set_costs(1.0)

    def _set_costs(self, factor: float) -> None:
        """Step costs in ns, the configured ones scaled by `factor` (one run's machine state)."""
        ms = 1_000_000 / self.config.speed * factor
        self._base_ns = self.config.step_base_ms * ms
        self._prefill_ns = self.config.per_prefill_token_ms * ms
        self._decode_ns = self.config.per_decode_seq_ms * ms

    @property
    def busy(self) -> bool:
        """Whether a request arriving now shares the batch with others."""
        return bool(self.running or self.waiting)

    def add(
        self,
        prompt_ids: list[int],
        output_len: int,
        notify: Callable[[Seq], None],
        output_ids: Sequence[int] = (),
    ) -> Seq:
        """Queue a request; `output_ids` (the tokens it will generate, when known) make the blocks
        its reply fills cacheable, as vLLM caches generated tokens' blocks."""
        tokens = [*prompt_ids, *output_ids[:output_len]] if output_ids else prompt_ids
        hashes = block_hashes(tokens, self.config.block_size) if self.config.prefix_cache else []
        seq = Seq(len(prompt_ids), output_len, hashes, notify)
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def abort(self, seq: Seq) -> None:
        """Drop a sequence whose client went away, freeing its blocks."""
        if seq.done:
            return
        seq.done = seq.aborted = True
        if seq in self.running:
            self.running.remove(seq)
            self._free(seq)
        else:
            self.waiting.remove(seq)

    def reset_prefix_cache(self) -> int:
        """Forget cached prefixes; with `run_noise` the next run also gets a machine state of its own
        (clocks, neighbours, thermals), as repetitions of one real engine differ between runs."""
        if self.config.run_noise:
            self._set_costs(1.0 + self.config.run_noise * (2.0 * self._run_noise.random() - 1.0))
        return self.pool.reset_cache()

    async def run(self) -> None:
        while True:
            if not (self.running or self.waiting):
                self._wake.clear()
                await self._wake.wait()
            start = now_ns()
            batch, prefill_tokens, decode_seqs = self._schedule()
            if not batch:  # only possible if the head of the queue can never fit; wait for a change
                self._wake.clear()
                await self._wake.wait()
                continue
            base = self._deadline_ns if start - self._deadline_ns < _CATCH_UP_NS else start
            self._deadline_ns = base + int(
                self._base_ns + prefill_tokens * self._prefill_ns + decode_seqs * self._decode_ns
            )
            await sleep_until(self._deadline_ns)
            self._commit(batch)

    def _schedule(self) -> tuple[list[tuple[Seq, int]], int, int]:
        """Pick this step's (sequence, tokens) pairs; returns them with prefill tokens and decode count."""
        budget = self.config.max_num_batched_tokens
        batch: list[tuple[Seq, int]] = []
        prefill = decodes = 0
        preemptions = self.stats.preemptions
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.prompt_len + seq.generated - seq.computed, budget)
            if not self._grow(seq, n):
                break  # seq itself was preempted: it was the newest, so nothing follows it
            batch.append((seq, n))
            budget -= n
            if seq.generated and n == 1:
                decodes += 1
            else:
                prefill += n
            i += 1
        # Like vLLM, a step that had to preempt admits nobody: memory is short.
        admit = self.stats.preemptions == preemptions
        while admit and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            n = self._admit(self.waiting[0], budget)
            if not n:
                break
            seq = self.waiting.popleft()
            self.running.append(seq)
            batch.append((seq, n))
            budget -= n
            prefill += n
        return batch, prefill, decodes

    def _grow(self, seq: Seq, n: int) -> bool:
        """Allocate blocks for n more tokens of a running seq, preempting the newest until they fit."""
        need = -(-(seq.computed + n) // self.config.block_size) - seq.blocks
        while not self.pool.allocate(need):
            victim = self.running.pop()
            self._free(victim)
            victim.computed = 0
            victim.preemptions += 1
            self.stats.preemptions += 1
            self.waiting.appendleft(victim)
            if victim is seq:
                return False
        seq.private += need
        return True

    def _admit(self, seq: Seq, budget: int) -> int:
        """Reserve blocks for the first chunk of a waiting seq, using cached prefix blocks; 0 if full."""
        size = self.config.block_size
        total = seq.prompt_len + seq.generated
        # At least one token is always computed, so a fully cached prompt still yields a token.
        hit, unheld = self.pool.cached_prefix(seq.hashes[: (total - 1) // size])
        n = min(total - hit * size, budget)
        need = -(-(hit * size + n) // size) - hit
        if need + unheld > self.pool.available:
            return 0
        self.pool.hold(seq.hashes[:hit])
        self.pool.allocate(need)
        seq.held = list(seq.hashes[:hit])
        seq.private = need
        seq.computed = hit * size
        self.stats.prefix_queries += seq.prompt_len
        self.stats.prefix_hits += seq.computed
        if not seq.admitted:
            seq.admitted = True
            seq.cached_tokens = seq.computed
        return n

    def _commit(self, batch: list[tuple[Seq, int]]) -> None:
        """Apply a finished step: advance KV, publish full prompt blocks, emit tokens."""
        now = now_ns()
        size = self.config.block_size
        finished = False
        self.stats.steps += 1
        for seq, n in batch:
            if seq.aborted:
                continue
            before = seq.computed
            seq.computed += n
            for b in range(before // size, min(seq.computed // size, len(seq.hashes))):
                if self.pool.publish(seq.hashes[b]):
                    seq.private -= 1
                    seq.held.append(seq.hashes[b])
            if seq.computed < seq.prompt_len + seq.generated:
                continue  # prefill chunk: no token yet
            self._emit(seq, now)
            if seq.generated >= seq.output_len:
                seq.done = finished = True
                self._free(seq)
                if self._observer:
                    self._observer.finished(seq)
            seq.notify(seq)
        if finished:
            self.running = [s for s in self.running if not s.done]

    def _emit(self, seq: Seq, now: int) -> None:
        seq.generated += 1
        seq.prev_token_ns, seq.last_token_ns = seq.last_token_ns, now
        if seq.generated == 1:
            seq.first_token_ns = now
            self.stats.prompt_tokens += seq.prompt_len
        self.stats.generation_tokens += 1
        if self._observer:
            self._observer.emitted(seq)

    def _free(self, seq: Seq) -> None:
        self.pool.release(seq.private, seq.held)
        seq.private = 0
        seq.held = []
