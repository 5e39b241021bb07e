"""The conditions each candidate was measured under, side by side, and where they differ.

A comparison means "this engine or config is better on our traffic" only when the rest was equal:
the same model, the same weight precision / quantization and the same KV-cache dtype. The result
headers carry what the replayer learned (engine version, /v1/models, the engine's published
configuration, GPUs) and what the user said (--engine-args, --note); differences in the
like-for-like fields become warnings. A value one side does not know is shown as unknown and is
never a difference: a warning names only values known on both sides. A candidate replayed with
approximate prompt lengths is not like for like with any other.
"""

from __future__ import annotations

from replayproxy.report.decision_types import ContractDoc
from replayproxy.report.runs import Run
from replayproxy.results import RunContract

# Fields whose difference makes a comparison not like for like, by where they are found.
LIKE_FOR_LIKE_CONFIG = ("cache_dtype", "kv_cache_dtype", "dtype", "quantization")
RESET_ACTIONS = ("reset_prefix_cache", "flush_cache", "erase_slots")  # vLLM, SGLang, llama.cpp
# What to change when a reset is refused, by (action, outcome).
RESET_FIXES = {
    ("reset_prefix_cache", "failed: HTTP 404"): "start vLLM with VLLM_SERVER_DEV_MODE=1",
    ("erase_slots", "failed: HTTP 501"): "start llama-server with --slot-save-path DIR",
}


def contract_of(run: Run) -> ContractDoc:
    """One candidate's contract, from its first run's header."""
    header = run.headers[0] if run.headers else None
    contract = header.contract if header is not None else RunContract()
    return {
        "label": run.label,
        "engine_version": header.engine_version if header is not None else "",
        "model": run.model,
        "max_model_len": contract.get("max_model_len"),
        "engine_config": contract.get("engine_config") or {},
        "gpus": contract.get("gpus") or [],
        "engine_args": contract.get("engine_args", ""),
        "note": contract.get("note", ""),
        "warmup": dict(header.warmup) if header is not None else {},
        "runs": run.repetitions,
        "cache_reset": cache_reset(run),
        "prompt_lengths": prompt_lengths(run),
    }


def prompt_lengths(run: Run) -> str:
    """ "exact" when every run's prompts were built through the target's tokenizer, else
    "approximate: <why>" (replayed with --allow-approximate)."""
    for header in run.headers:
        prompts = header.pre_run.get("prompts")
        if isinstance(prompts, dict) and prompts.get("lengths") == "approximate":
            reason = prompts.get("reason")
            return f"approximate: {reason}" if reason else "approximate"
    return "exact"


def cache_reset(run: Run) -> str:
    """ "ok" when every run's cache reset worked, else the first other outcome ("skipped", "failed:
    ...", or "no reset action" when the flavor has none) with the fix where one is known; "cache-warm
    (...)" when the run header says the run started on whatever the engine had cached."""
    outcomes = [(n, str(h.pre_run[n])) for h in run.headers for n in RESET_ACTIONS if n in h.pre_run]
    bad = [(name, outcome) for name, outcome in outcomes if outcome != "ok"]
    if outcomes and not bad:
        return "ok"
    why = reset_failure(*bad[0]) if bad else "no reset action"
    warm = any(h.pre_run.get("cache_start") == "cache-warm" for h in run.headers)
    return f"cache-warm ({why})" if warm else why


def reset_failure(action: str, outcome: str) -> str:
    """ "erase_slots failed: HTTP 501; start llama-server with --slot-save-path DIR" """
    fix = RESET_FIXES.get((action, outcome))
    return f"{action} {outcome}" + (f"; {fix}" if fix else "")


def differences(contracts: list[ContractDoc]) -> list[str]:
    """'not a like-for-like comparison' warnings: model, precision, KV dtype, context length."""
    if len(contracts) < 2:
        return []
    out = [
        f"not a like-for-like comparison: {c['label']} was replayed with approximate prompt lengths "
        f"({c['prompt_lengths'].removeprefix('approximate').lstrip(': ') or 'no tokenizer'})"
        for c in contracts
        if c["prompt_lengths"].startswith("approximate")
    ]
    first = contracts[0]
    for other in contracts[1:]:
        for what, a, b in _fields(first, other):
            if _known(a) and _known(b) and a != b:
                out.append(
                    f"not a like-for-like comparison: {first['label']} and {other['label']} differ in "
                    f"{what} ({a} vs {b})"
                )
    return out


def _known(value: object) -> bool:
    return value not in (None, "", "?")


def _fields(a: ContractDoc, b: ContractDoc) -> list[tuple[str, object, object]]:
    fields: list[tuple[str, object, object]] = [("model", a["model"], b["model"])]
    if a["max_model_len"] and b["max_model_len"]:
        fields.append(("max_model_len", a["max_model_len"], b["max_model_len"]))
    for key in LIKE_FOR_LIKE_CONFIG:
        if key in a["engine_config"] or key in b["engine_config"]:
            fields.append((key, a["engine_config"].get(key), b["engine_config"].get(key)))
    gpus_a = sorted(g.get("name", "") for g in a["gpus"])
    gpus_b = sorted(g.get("name", "") for g in b["gpus"])
    if gpus_a and gpus_b:
        fields.append(("GPUs", ", ".join(gpus_a), ", ".join(gpus_b)))
    return fields
