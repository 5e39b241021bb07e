"""The check's verdict in words, most serious first, and the values its gate rules read.

Order follows what invalidates a candidate soonest: a prompt-token difference (another template
or tokenizer: every answer after it is suspect), then differing outputs, stop handling,
structured-output validity, determinism and errors.
"""

from __future__ import annotations

from collections.abc import Callable

from replayproxy.report.checks.document_types import CheckDoc, CheckTargetDoc

Figure = Callable[[CheckTargetDoc], float | None]
# Gate metric -> (the target's figure, whether the baseline's own value counts)
GATE_METRICS: dict[str, tuple[Figure, bool]] = {
    "match": (lambda t: t["match"], False),
    "similarity": (lambda t: t["similarity"], False),
    "prompt_tokens": (lambda t: t["prompt_tokens_equal"], False),
    "determinism": (lambda t: t["determinism"], True),
    "json_valid": (lambda t: t["json_valid"], True),
    "schema_valid": (lambda t: t["schema_valid"], True),
    "tool_valid": (lambda t: t["tool_valid"], True),
    "reference_match": (lambda t: t["reference_match"], True),
    "reference_similarity": (lambda t: t["reference_similarity"], True),
    "score": (lambda t: t["score"], True),
    "error_rate": (lambda t: t["error_rate"], True),
}


def gate_values(doc: CheckDoc) -> dict[str, list[tuple[str, float | None]]]:
    values: dict[str, list[tuple[str, float | None]]] = {}
    for metric, (figure, baseline_too) in GATE_METRICS.items():
        values[metric] = [
            (t["label"], figure(t)) for t in doc["targets"] if baseline_too or not t["baseline"]
        ]
    return values


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def verdict(targets: list[CheckTargetDoc], repeat: int) -> list[str]:
    """Findings as sentences; the first line of the report joins them. Without any problem, one
    all-clear sentence; with problems, each target's match rate still appears, in its place."""
    base = next(t for t in targets if t["baseline"])
    findings: list[str] = []
    problems = 0
    others = [t for t in targets if not t["baseline"]]
    for t in others:
        findings += _template(t, base)
    for t in others:
        if t["match"] == 1:
            line = f"{t['label']} matches {base['label']} on all {t['compared']} prompts both answered"
            findings.append(line)
            problems -= 1
        findings += _outputs(t, base)
    for t in others:
        findings += _stops(t, base)
        findings += _structured(t, base)
    for t in targets:
        findings += _determinism(t, repeat)
        if t["errors"]:
            examples = ", ".join(f"{e['message']} on {e['prompts']}" for e in t["error_examples"])
            findings.append(f"{t['label']} failed {t['errors']} of {t['answers']} requests ({examples})")
    if problems + len(findings) == 0:
        return [_all_clear(repeat, others, base)]
    return findings


def _template(t: CheckTargetDoc, base: CheckTargetDoc) -> list[str]:
    equal, delta = t["prompt_tokens_equal"], t["prompt_tokens_delta_mean"]
    if equal is None or equal == 1 or delta is None:  # a share of requests compared means a mean delta
        return []
    per_message = t["prompt_tokens_delta_per_message"]
    more = "more" if delta >= 0 else "fewer"
    text = (
        f"PROMPT TOKENS DIFFER: {t['label']} renders identical requests with {abs(delta):.3g} {more} tokens"
    )
    text += " per request"
    if per_message is not None:
        text += f" ({abs(per_message):.3g} per message)"
    return [f"{text} than {base['label']} (another chat template or tokenizer; equal on {_pct(equal)})"]


def _outputs(t: CheckTargetDoc, base: CheckTargetDoc) -> list[str]:
    if t["match"] is None or t["match"] == 1:
        return []
    text = f"{_pct(1 - t['match'])} of {t['label']}'s outputs differ from {base['label']}'s at temperature 0"
    if t["similarity_differing"] is not None:
        text += f" (similarity {t['similarity_differing']:.2f} where they differ)"
    return [text]


def _stops(t: CheckTargetDoc, base: CheckTargetDoc) -> list[str]:
    found = []
    if t["stop_prompts"] and t["stop_prompts_ended_by_stop"] != base["stop_prompts_ended_by_stop"]:
        mine, theirs = _tokens(t["stop_prompts_tokens_mean"]), _tokens(base["stop_prompts_tokens_mean"])
        found.append(
            f"{t['label']} finishes {t['stop_prompts_ended_by_stop']} of {t['stop_prompts']} prompts that "
            f"carry `stop` with finish_reason stop, {base['label']} {base['stop_prompts_ended_by_stop']}"
            f" (mean {mine} vs {theirs} tokens)"
        )
    a, b = base["natural_tokens_p50"], t["natural_tokens_p50"]
    if a is not None and b is not None and abs(a - b) > 0.2 * max(a, b, 1):
        found.append(
            f"natural output length p50 {b:.0f} tokens at {t['label']} vs {a:.0f} at {base['label']}"
        )
    return found


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _structured(t: CheckTargetDoc, base: CheckTargetDoc) -> list[str]:
    found = []
    for figure, name in (
        (GATE_METRICS["json_valid"][0], "JSON valid"),
        (GATE_METRICS["schema_valid"][0], "schema valid"),
        (GATE_METRICS["tool_valid"][0], "tool calls valid"),
    ):
        a, b = figure(base), figure(t)
        if a is not None and b is not None and a != b:
            found.append(f"{name} {_pct(b)} at {t['label']} vs {_pct(a)} at {base['label']}")
    a, b = base["tool_call_rate"], t["tool_call_rate"]
    if a is not None and b is not None and a != b:
        found.append(
            f"tool called on {_pct(b)} of tool prompts at {t['label']} vs {_pct(a)} at {base['label']}"
        )
    return found


def _determinism(t: CheckTargetDoc, repeat: int) -> list[str]:
    if t["determinism"] is None or t["determinism"] == 1:
        return []
    changed = len(t["nondeterministic_prompts"])
    return [
        f"{t['label']} is not deterministic: {changed} prompts changed across its {repeat} repeats "
        f"({_pct(t['determinism'])} stable)"
    ]


def _all_clear(repeat: int, others: list[CheckTargetDoc], base: CheckTargetDoc) -> str:
    parts = []
    for t in others:
        parts.append(
            f"{t['label']} matches {base['label']} on {_pct(t['match'] or 0)} of {t['compared']} prompts"
        )
    if others and all(t["prompt_tokens_equal"] == 1 for t in others):
        parts.append("prompt tokens equal")
    if repeat > 1:
        parts.append(f"every target deterministic over {repeat} repeats")
    return "; ".join(parts) or "nothing to compare"
