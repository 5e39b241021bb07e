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
from collections.abc import Sequence
from dataclasses import replace

from replayproxy.sim.api import GenRequest
from replayproxy.sim.config import SimConfig
from replayproxy.sim.sampler import OutputPlan, Sampler
from replayproxy.sim.structured import TOOL_CALL
from replayproxy.sim.tokenizer import END_HEADER_ID

Vocabulary = tuple[Sequence[int], Sequence[str]]  # token ids and their pieces, as Sampler.vocabulary


def with_template_variant(prompt_ids: list[int], messages: int, extra_per_message: int) -> list[int]:
    """The prompt as a template that adds `extra_per_message` tokens to each message renders it."""
    if not (messages and extra_per_message):
        return prompt_ids
    return prompt_ids + [END_HEADER_ID] * (messages * extra_per_message)


def batch_variant(plan: OutputPlan, rng: random.Random, vocabulary: Vocabulary) -> OutputPlan:
    """The plan as a batch-variant kernel changes it: the same up to a token in the second half,
    then other words (length and finish reason kept). Shaped answers keep their JSON intact."""
    words = sum(1 for p in plan.pieces if p)
    if plan.shaped or words < 2:
        return plan
    cut = rng.randint(plan.length // 2, plan.length - 1)
    tail = [
        _other_word(p, rng, vocabulary) if p else (old, "")
        for p, old in zip(plan.pieces[cut:], plan.ids[cut:], strict=True)
    ]
    return replace(
        plan,
        pieces=plan.pieces[:cut] + tuple(p for _, p in tail),
        ids=plan.ids[:cut] + tuple(i for i, _ in tail),
    )


def _other_word(original: str, rng: random.Random, vocabulary: Vocabulary) -> tuple[int, str]:
    """A word drawn anew (id, piece), never the one it replaces, so a diverged answer always differs."""
    ids, pieces = vocabulary
    while True:
        at = rng.randrange(len(ids))
        if pieces[at] != original:
            return ids[at], pieces[at]


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
        plan = batch_variant(plan, variance, sampler.vocabulary)
    return plan, with_template_variant(req.prompt_ids, req.messages, config.chat_template_extra_tokens)
