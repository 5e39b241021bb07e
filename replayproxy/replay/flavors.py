"""Per-engine request tweaks as data: each engine's names for the same thing, and pre-run actions.

A flavor says how to force an exact output length (`ignore_eos`, `min_tokens` or nothing), whether
`/v1/completions` takes token ids, which streaming usage options exist, which sampling parameters
it accepts, how to read its version and what to do before a run (e.g. vLLM's prefix-cache reset).
`request_body` turns one planned request into the JSON object sent; docs/replay.md has the table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from replayproxy.errors import BadOption

# Harmless stand-ins for recorded tools / response formats, whose content is never recorded.
DUMMY_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_word",
        "description": "Look up a word in a dictionary.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}
JSON_OBJECT = {"type": "json_object"}
COMMON_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")
ENGINE_SAMPLING = (*COMMON_SAMPLING, "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True, slots=True)
class Action:
    """An HTTP call made once before the clock starts; its outcome goes into the result header.
    A `{slot}` in the path makes it one call per slot the engine lists (llama.cpp's slot erase)."""

    name: str
    method: str
    path: str


@dataclass(frozen=True, slots=True)
class Flavor:
    name: str
    token_id_prompts: bool = False  # /v1/completions accepts `prompt: [ids]` verbatim (no BOS added)
    ignore_eos: bool = False
    min_tokens_key: str | None = None  # the name of "generate at least this many tokens"
    include_usage: bool = True  # stream_options.include_usage
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (usage in every chunk)
    sampling: tuple[str, ...] = COMMON_SAMPLING
    n: bool = True
    tools: bool = True
    tool_choice: str | None = None  # sent with the dummy tool, e.g. "none" so no tool parser is needed
    response_format: bool = True
    version_paths: tuple[str, ...] = ()  # GET, JSON answer with a `version` field
    pre_run: tuple[Action, ...] = ()

    @property
    def exact_output(self) -> bool:
        return self.ignore_eos or self.min_tokens_key is not None


# vLLM, SGLang and TensorRT-LLM share vLLM's OpenAI-server extensions for exact lengths.
_VLLM_LIKE = Flavor(
    "vllm",
    token_id_prompts=True,
    ignore_eos=True,
    min_tokens_key="min_tokens",
    continuous_usage=True,
    sampling=ENGINE_SAMPLING,
    tool_choice="none",
    version_paths=("/version",),
)

FLAVORS: dict[str, Flavor] = {
    "vllm": replace(_VLLM_LIKE, pre_run=(Action("reset_prefix_cache", "POST", "/reset_prefix_cache"),)),
    "sglang": replace(
        _VLLM_LIKE,
        name="sglang",
        version_paths=("/version", "/get_server_info"),
        pre_run=(Action("flush_cache", "POST", "/flush_cache"),),
    ),
    "trtllm": replace(_VLLM_LIKE, name="trtllm"),
    "tgi": Flavor("tgi", sampling=(*COMMON_SAMPLING,), n=False, version_paths=("/info",)),
    "llamacpp": Flavor(
        "llamacpp",
        token_id_prompts=True,
        ignore_eos=True,
        sampling=(*COMMON_SAMPLING, "top_k", "min_p"),
        n=False,
        version_paths=("/props",),
        # Works only on a server started with --slot-save-path (else 501): the run is then cache-warm.
        pre_run=(Action("erase_slots", "POST", "/slots/{slot}?action=erase"),),
    ),
    "ollama": Flavor("ollama", n=False, version_paths=("/api/version",)),
    "openai": Flavor("openai"),
}


def get(name: str) -> Flavor:
    try:
        return FLAVORS[name]
    except KeyError:
        raise BadOption(f"unknown flavor {name!r}; valid: {', '.join(FLAVORS)}") from None


# `owned_by` substrings in /v1/models -> flavor (the simulated engine is vLLM-compatible).
OWNERS = (
    ("vllm", "vllm"), ("replayproxy-sim", "vllm"), ("sglang", "sglang"), ("tensorrt", "trtllm"),
    ("llamacpp", "llamacpp"), ("ollama", "ollama"), ("library", "ollama"), ("tgi", "tgi"),
)  # fmt: skip


def guess(models_answer: Any) -> str:
    """A flavor from the /v1/models answer's `owned_by`, or "openai" when it says nothing known."""
    data = models_answer.get("data") if isinstance(models_answer, dict) else None
    owners = {str(card.get("owned_by", "")).lower() for card in data or [] if isinstance(card, dict)}
    for owner, flavor in OWNERS:
        if any(owner in o for o in owners):
            return flavor
    return "openai"


@dataclass(frozen=True, slots=True)
class Planned:
    """What the body of one request must say, independent of the engine."""

    endpoint: str  # "chat" | "completions"
    model: str
    prompt: Any  # chat: [{"role", "content"}]; completions: text or token ids
    stream: bool
    max_tokens: int
    sampling: dict[str, float | int | bool]
    tools: bool
    response_format: bool


def request_body(flavor: Flavor, plan: Planned) -> dict[str, Any]:
    """The JSON object for `plan` in `flavor`'s dialect; key order is fixed so bytes are reproducible."""
    body: dict[str, Any] = {"model": plan.model}
    body["messages" if plan.endpoint == "chat" else "prompt"] = plan.prompt
    body["max_tokens"] = plan.max_tokens
    if flavor.ignore_eos:
        body["ignore_eos"] = True
    if flavor.min_tokens_key is not None:
        body[flavor.min_tokens_key] = plan.max_tokens
    for key in flavor.sampling:
        if key in plan.sampling and not isinstance(plan.sampling[key], bool):
            body[key] = plan.sampling[key]
    n = plan.sampling.get("n")
    if flavor.n and isinstance(n, int) and not isinstance(n, bool) and n > 1:
        body["n"] = n
    if plan.endpoint == "chat" and plan.tools and flavor.tools:
        body["tools"] = [DUMMY_TOOL]
        if flavor.tool_choice is not None:
            body["tool_choice"] = flavor.tool_choice
    if plan.endpoint == "chat" and plan.response_format and flavor.response_format:
        body["response_format"] = JSON_OBJECT
    body["stream"] = plan.stream
    if plan.stream and (flavor.include_usage or flavor.continuous_usage):
        options = {"include_usage": True}
        if flavor.continuous_usage:
            options["continuous_usage_stats"] = True
        body["stream_options"] = options
    return body
