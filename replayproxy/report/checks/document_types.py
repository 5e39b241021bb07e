"""The output-check document, typed: `summary` fills it, the verdict, the gate and the tables
read it, and mypy checks both sides. The keys are the ones `--json` writes (docs/check.md); a share
that had nothing to count is None (null), as is a baseline's comparison with itself.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class ErrorExample(TypedDict):
    message: str
    prompts: str  # the ids of the prompts that got it, comma-separated


class AnswerCounts(TypedDict):
    answers: int
    errors: int
    error_classes: dict[str, int]
    error_examples: list[ErrorExample]  # the first three messages
    error_rate: float | None
    e2e_p50_ms: float | None


class PromptTokenFigures(TypedDict):
    """Prompt tokens of identical requests against the baseline's: another template or tokenizer."""

    prompt_tokens_compared: int | None
    prompt_tokens_equal: float | None
    prompt_tokens_delta_mean: float | None
    prompt_tokens_delta_per_message: float | None


class LengthFigures(TypedDict):
    """Finish reasons and the lengths of answers the engine ended itself (first answers)."""

    finish_reasons: dict[str, int]
    length_share: float | None
    natural_tokens_p50: float | None
    completion_tokens_mean: float | None
    stop_prompts: int  # prompts that carry `stop`
    stop_prompts_ended_by_stop: int
    stop_prompts_tokens_mean: float | None


class MatchFigures(TypedDict):
    """First answers against the baseline's, over the prompts both answered."""

    compared: int | None
    match: float | None  # share of identical outputs
    similarity: float | None
    similarity_differing: float | None  # mean similarity where the outputs differ


class DeterminismFigures(TypedDict):
    determinism: float | None  # share of prompts answered identically across the target's repeats
    nondeterministic_prompts: list[str]


class StructuredFigures(TypedDict):
    json_valid: float | None
    schema_valid: float | None
    tool_valid: float | None
    tool_call_rate: float | None  # share of tool prompts answered with a tool call


class ReferenceFigures(TypedDict):
    reference_match: float | None
    reference_similarity: float | None
    score: float | None  # mean of the user scorer's scores
    scored_answers: int


class WorstPrompt(TypedDict):
    """A prompt whose answers differ most; each pair is (baseline, target)."""

    id: str
    similarity: float
    prompt_tokens: list[int]
    completion_tokens: list[int]
    finish_reasons: list[str]
    outputs: NotRequired[list[str]]  # only when the check kept outputs


class CheckTargetDoc(
    AnswerCounts,
    PromptTokenFigures,
    LengthFigures,
    MatchFigures,
    DeterminismFigures,
    StructuredFigures,
    ReferenceFigures,
):
    """One target's findings, in the order `--json` writes them: who it is, then each figure group."""

    label: str
    url: str
    flavor: str
    engine_version: str
    model: str
    baseline: bool
    worst: list[WorstPrompt]


class CheckGate(TypedDict):
    spec: str
    failures: list[str]  # one line per broken rule; empty: passed


class CheckDoc(TypedDict):
    """One check file's document."""

    kind: str  # "check"
    path: str
    baseline: str
    prompts: str
    prompt_count: int
    repeat: int
    warmup: int
    concurrency: int
    sampling: dict[str, object]  # the pinned sampling: temperature, seed, max_tokens
    keep_outputs: bool
    scored: bool
    targets: list[CheckTargetDoc]
    warnings: list[str]
    findings: list[str]
    verdict: str  # the findings joined
    gate: NotRequired[CheckGate]  # only with --gate rules
