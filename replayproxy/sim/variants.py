"""Engine differences an output check must find, one knob each (see docs/sim.md, "Variants").

Two builds of one model differ in ways that change answers at temperature 0: the chat template
(extra tokens per message), batch-variant kernels (a greedy answer changes when other requests
share the batch). The other knobs (`output_seed`, `ignore_stop`, `ignore_response_format`) act
where the sampler and the request parser already decide. Each knob changes only its own finding:
the template's extra tokens are counted and take KV, but the drawn text keys on the standard
rendering, so a template variant shows as a prompt-token difference alone.
"""

from __future__ import annotations

import random
from dataclasses import replace

from replayproxy.sim.api import GenRequest
from replayproxy.sim.config import SimConfig
from replayproxy.sim.sampler import OutputPlan, Sampler
from replayproxy.sim.structured import TOOL_CALL
from replayproxy.sim.tokenizer import END_HEADER_ID, GENERATED_IDS, piece


def with_template_variant(prompt_ids: list[int], messages: int, extra_per_message: int) -> list[int]:
    """The prompt as a template that adds `extra_per_message` tokens to each message renders it."""
    if not (messages and extra_per_message):
        return prompt_ids
    return prompt_ids + [END_HEADER_ID] * (messages * extra_per_message)


def batch_variant(plan: OutputPlan, rng: random.Random) -> OutputPlan:
    """The plan as a batch-variant kernel changes it: the same up to a token in the second half,
    then other words (length and finish reason kept). Shaped answers keep their JSON intact."""
    words = sum(1 for p in plan.pieces if p)
    if plan.shaped or words < 2:
        return plan
    cut = rng.randint(plan.length // 2, plan.length - 1)
    tail = [_other_word(p, rng) if p else "" for p in plan.pieces[cut:]]
    return replace(plan, pieces=plan.pieces[:cut] + tuple(tail))


def _other_word(original: str, rng: random.Random) -> str:
    """A word drawn anew, never the one it replaces, so a diverged answer always differs."""
    while True:
        drawn = piece(rng.choice(GENERATED_IDS))
        if drawn != original:
            return drawn


def answer_plan(
    sampler: Sampler, config: SimConfig, req: GenRequest, batch_busy: bool, variance: random.Random
) -> tuple[OutputPlan, list[int]]:
    """What a request will generate under the configured variants, and the prompt ids the engine
    holds for it (the template variant's extra tokens included)."""
    sampling = replace(req.sampling, stop=()) if config.ignore_stop else req.sampling
    structure = req.structure
    if config.ignore_response_format and structure is not None and structure.kind != TOOL_CALL:
        structure = None
    plan = sampler.plan(req.prompt_ids, sampling, structure)
    if config.batch_variance and batch_busy:
        plan = batch_variant(plan, variance)
    return plan, with_template_variant(req.prompt_ids, req.messages, config.chat_template_extra_tokens)
