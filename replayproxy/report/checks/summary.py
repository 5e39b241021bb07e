"""A check file as a document: per target, the findings of an output check against the baseline.

Pairs are made on a prompt's first answer (repeat 0) at each target; determinism looks at a
target's own repeats. Numbers are shares of the prompts both targets answered, so an error
never counts as a match or a difference. The document's shape is in docs/check.md.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from replayproxy.report.checks.document_types import (
    AnswerCounts,
    CheckDoc,
    CheckTargetDoc,
    DeterminismFigures,
    LengthFigures,
    MatchFigures,
    PromptTokenFigures,
    ReferenceFigures,
    StructuredFigures,
    WorstPrompt,
)
from replayproxy.report.checks.verdict import verdict
from replayproxy.results import NOT_APPLICABLE, CheckFile

PPM = 1_000_000
WORST = 5  # prompts listed per target in "worst-differing prompts"


@dataclass(frozen=True, slots=True)
class _Answers:
    """One target's rows, indexed [prompt index][repeat] -> row number (-1: none)."""

    rows: np.ndarray

    def first(self, prompt: int) -> int:
        return int(self.rows[prompt, 0])


def build_check_document(check: CheckFile) -> CheckDoc:
    header = check.header
    cols = {name: check.column(name) for name in check.table.columns}
    labels = [t.label for t in header.targets]
    answered = int(cols["prompt_index"].max()) + 1 if len(check) else 0  # prompts after it have no row
    indexes = {label: _index(cols, label, answered, header.repeat) for label in labels}
    ok = cols["error"] == ""
    base = indexes[header.baseline]
    targets: list[CheckTargetDoc] = []
    for target in header.targets:
        own = indexes[target.label]
        is_baseline = target.label == header.baseline
        targets.append(
            {
                "label": target.label,
                "url": target.url,
                "flavor": target.flavor,
                "engine_version": target.engine_version,
                "model": _model(target.models),
                "baseline": is_baseline,
                **_counts(cols, ok, own),
                **_prompt_tokens(cols, ok, own, base, is_baseline),
                **_lengths(cols, ok, own),
                **_matches(cols, ok, own, base, is_baseline),
                **_determinism(cols, ok, own, header.repeat),
                **_structured(cols, ok, own),
                **_reference(cols, ok, own),
                "worst": [] if is_baseline else _worst(cols, ok, own, base, header.keep_outputs),
            }
        )
    findings = verdict(targets, header.repeat)
    return {
        "kind": "check",
        "path": str(check.path),
        "baseline": header.baseline,
        "prompts": header.prompts,
        "prompt_count": header.prompt_count,
        "repeat": header.repeat,
        "warmup": header.warmup,
        "concurrency": header.concurrency,
        "sampling": dict(header.sampling),
        "keep_outputs": header.keep_outputs,
        "scored": header.scored,
        "targets": targets,
        "warnings": _warnings(header.repeat, len(targets)),
        "findings": findings,
        "verdict": "; ".join(findings),
    }


def _index(cols: dict[str, np.ndarray], label: str, prompts: int, repeat: int) -> _Answers:
    rows = np.full((prompts, max(repeat, 1)), -1, dtype=np.int64)
    mine = np.flatnonzero(cols["target"] == label)
    rows[cols["prompt_index"][mine], cols["repeat"][mine]] = mine
    return _Answers(rows)


def _model(models: object) -> str:
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return str(data[0].get("id", ""))
    return ""


def _share(hits: int, total: int) -> float | None:
    return hits / total if total else None


def _pairs(ok: np.ndarray, own: _Answers, base: _Answers) -> list[tuple[int, int]]:
    """(own row, baseline row) of each prompt whose first answer succeeded at both."""
    pairs = []
    for prompt in range(own.rows.shape[0]):
        a, b = own.first(prompt), base.first(prompt)
        if a >= 0 and b >= 0 and ok[a] and ok[b]:
            pairs.append((a, b))
    return pairs


def _counts(cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers) -> AnswerCounts:
    rows = own.rows[own.rows >= 0]
    errors: dict[str, int] = {}
    failing: dict[str, str] = {}  # message -> the prompt ids that got it
    for row in rows[~ok[rows]]:
        errors[str(cols["error"][row])] = errors.get(str(cols["error"][row]), 0) + 1
        message = str(cols["error_message"][row]) or str(cols["error"][row])
        ids = failing.setdefault(message, "")
        prompt_id = str(cols["prompt_id"][row])
        if prompt_id not in ids.split(", "):
            failing[message] = f"{ids}, {prompt_id}" if ids else prompt_id
    e2e = cols["e2e_ns"][rows[ok[rows]]]
    return {
        "answers": int(len(rows)),
        "errors": int(len(rows) - ok[rows].sum()),
        "error_classes": errors,
        "error_examples": [{"message": m, "prompts": ids} for m, ids in list(failing.items())[:3]],
        "error_rate": _share(int(len(rows) - ok[rows].sum()), int(len(rows))),
        "e2e_p50_ms": float(np.median(e2e)) / 1e6 if len(e2e) else None,
    }


def _prompt_tokens(
    cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers, base: _Answers, is_baseline: bool
) -> PromptTokenFigures:
    """Prompt tokens for identical requests: a difference is a different template or tokenizer."""
    if is_baseline:
        return {
            "prompt_tokens_compared": None,
            "prompt_tokens_equal": None,
            "prompt_tokens_delta_mean": None,
            "prompt_tokens_delta_per_message": None,
        }
    deltas, per_message = [], []
    for a, b in _pairs(ok, own, base):
        mine, theirs = int(cols["prompt_tokens"][a]), int(cols["prompt_tokens"][b])
        if mine < 0 or theirs < 0:
            continue
        deltas.append(mine - theirs)
        if cols["messages"][a] > 0:
            per_message.append((mine - theirs) / int(cols["messages"][a]))
    return {
        "prompt_tokens_compared": len(deltas),
        "prompt_tokens_equal": _share(sum(1 for d in deltas if d == 0), len(deltas)),
        "prompt_tokens_delta_mean": statistics.fmean(deltas) if deltas else None,
        "prompt_tokens_delta_per_message": statistics.fmean(per_message) if per_message else None,
    }


def _lengths(cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers) -> LengthFigures:
    """Finish reasons and natural lengths (answers the engine ended itself) of first answers."""
    firsts = [own.first(p) for p in range(own.rows.shape[0])]
    firsts = [r for r in firsts if r >= 0 and ok[r]]
    finish: dict[str, int] = {}
    for r in firsts:
        reason = str(cols["finish_reason"][r]) or "unknown"
        finish[reason] = finish.get(reason, 0) + 1
    natural = [
        int(cols["completion_tokens"][r])
        for r in firsts
        if cols["finish_reason"][r] != "length" and cols["completion_tokens"][r] >= 0
    ]
    stops = [r for r in firsts if cols["has_stop"][r]]
    return {
        "finish_reasons": finish,
        "length_share": _share(finish.get("length", 0), len(firsts)),
        "natural_tokens_p50": float(np.median(natural)) if natural else None,
        "completion_tokens_mean": statistics.fmean(int(cols["completion_tokens"][r]) for r in firsts)
        if firsts
        else None,
        "stop_prompts": len(stops),
        "stop_prompts_ended_by_stop": sum(1 for r in stops if cols["finish_reason"][r] == "stop"),
        "stop_prompts_tokens_mean": statistics.fmean(int(cols["completion_tokens"][r]) for r in stops)
        if stops
        else None,
    }


def _matches(
    cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers, base: _Answers, is_baseline: bool
) -> MatchFigures:
    if is_baseline:
        return {"compared": None, "match": None, "similarity": None, "similarity_differing": None}
    pairs = _pairs(ok, own, base)
    same = [cols["output_hash"][a] == cols["output_hash"][b] for a, b in pairs]
    similar = [int(cols["similarity_ppm"][a]) / PPM for a, _ in pairs]
    differing = [s for s, equal in zip(similar, same, strict=True) if not equal]
    return {
        "compared": len(pairs),
        "match": _share(sum(same), len(pairs)),
        "similarity": statistics.fmean(similar) if similar else None,
        "similarity_differing": statistics.fmean(differing) if differing else None,
    }


def _determinism(
    cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers, repeat: int
) -> DeterminismFigures:
    """Share of prompts whose answers are identical across the target's own repeats."""
    if repeat < 2:
        return {"determinism": None, "nondeterministic_prompts": []}
    stable, unstable, seen = 0, [], 0
    for prompt in range(own.rows.shape[0]):
        rows = own.rows[prompt]
        if (rows < 0).any() or not ok[rows].all():
            continue
        seen += 1
        if len({str(h) for h in cols["output_hash"][rows]}) == 1:
            stable += 1
        else:
            unstable.append(str(cols["prompt_id"][rows[0]]))
    return {"determinism": _share(stable, seen), "nondeterministic_prompts": unstable}


def _structured(cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers) -> StructuredFigures:
    rows = own.rows[own.rows >= 0]
    rows = rows[ok[rows]]

    def rate(name: str) -> float | None:
        values = cols[name][rows]
        applicable = values[values != NOT_APPLICABLE]
        return _share(int((applicable == 1).sum()), len(applicable))

    tools = rows[cols["structure"][rows] == "tools"]
    return {
        "json_valid": rate("json_valid"),
        "schema_valid": rate("schema_valid"),
        "tool_valid": rate("tool_valid"),
        "tool_call_rate": _share(int((cols["tool_calls"][tools] > 0).sum()), len(tools)),
    }


def _reference(cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers) -> ReferenceFigures:
    rows = own.rows[own.rows >= 0]
    rows = rows[ok[rows]]
    exact = cols["reference_exact"][rows]
    exact = exact[exact != NOT_APPLICABLE]
    similar = cols["reference_similarity_ppm"][rows]
    similar = similar[similar >= 0]
    scores = [float(s) for s in cols["score"][rows] if s]
    return {
        "reference_match": _share(int((exact == 1).sum()), len(exact)),
        "reference_similarity": float(similar.mean()) / PPM if len(similar) else None,
        "score": statistics.fmean(scores) if scores else None,
        "scored_answers": len(scores),
    }


def _worst(
    cols: dict[str, np.ndarray], ok: np.ndarray, own: _Answers, base: _Answers, keep: bool
) -> list[WorstPrompt]:
    differing = [(a, b) for a, b in _pairs(ok, own, base) if cols["output_hash"][a] != cols["output_hash"][b]]
    differing.sort(
        key=lambda pair: (int(cols["similarity_ppm"][pair[0]]), int(cols["prompt_index"][pair[0]]))
    )
    worst = []
    for a, b in differing[:WORST]:
        item: WorstPrompt = {
            "id": str(cols["prompt_id"][a]),
            "similarity": int(cols["similarity_ppm"][a]) / PPM,
            "prompt_tokens": [int(cols["prompt_tokens"][b]), int(cols["prompt_tokens"][a])],
            "completion_tokens": [int(cols["completion_tokens"][b]), int(cols["completion_tokens"][a])],
            "finish_reasons": [str(cols["finish_reason"][b]), str(cols["finish_reason"][a])],
        }
        if keep:
            item["outputs"] = [str(cols["output"][b]), str(cols["output"][a])]
        worst.append(item)
    return worst


def _warnings(repeat: int, targets: int) -> list[str]:
    warnings = [
        "Replays force output lengths (ignore_eos / min_tokens), so they cannot show stop handling; "
        "the finish reasons and natural lengths here can."
    ]
    if repeat < 2:
        warnings.append("One answer per prompt: determinism is unknown (use --repeat 3).")
    if targets < 2:
        warnings.append("One target: nothing to compare against; only determinism and validity are shown.")
    return warnings
