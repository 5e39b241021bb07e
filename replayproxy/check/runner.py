"""One output check: warm-up, then every prompt `repeat` times to each target, then rows scored.

Targets run one after another (a target never shares its machine with another's load); within a
target at most `concurrency` requests are in flight, repeat by repeat, so batch effects on
answers show only when the user raises it. Rows are scored once every answer is in: similarity
needs the baseline's answer to the same prompt.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from replayproxy import __version__, clock
from replayproxy.check import scorer, scoring
from replayproxy.check.client import Answer, send
from replayproxy.check.prompts import Prompt, PromptSet
from replayproxy.check.requests import PATHS, Sampling, request_body
from replayproxy.results import CheckHeader, CheckRow, CheckTarget, CheckWriter

_log = logging.getLogger("replayproxy.check")
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CheckOptions:
    targets: tuple[CheckTarget, ...]
    prompts: PromptSet
    output: Path
    baseline: str = ""  # label; "" = the first target
    models: dict[str, str] = field(default_factory=dict)  # label -> model name sent ("" = none)
    sampling: Sampling = Sampling()
    repeat: int = 3
    warmup: int = 1
    concurrency: int = 1
    timeout_s: float = 300.0
    keep_outputs: bool = False
    score_command: str = ""
    api_key: str = ""

    @property
    def baseline_label(self) -> str:
        return self.baseline or self.targets[0].label


# answers[label][prompt index][repeat]
Answers = dict[str, list[list[Answer]]]


async def run_check(options: CheckOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Send, score, write the .rpc file; returns the footer's counts."""
    start_wall_ns = clock.wall_ns()
    answers: Answers = {}
    headers = {"Content-Type": "application/json"}
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    try:
        for target in options.targets:
            answers[target.label] = await _ask_target(options, target, headers, progress)
        scores = await _user_scores(options, answers)
    except asyncio.CancelledError:
        if answers:  # the targets answered in full are kept, unscored
            _write(options, start_wall_ns, _rows(options, answers, {}), 0, interrupted=True)
        raise
    failures = sum(1 for value in scores.values() if value is None)
    return _write(options, start_wall_ns, _rows(options, answers, scores), failures)


def _write(
    options: CheckOptions,
    start_wall_ns: int,
    rows: list[CheckRow],
    scorer_failures: int,
    interrupted: bool = False,
) -> dict[str, Any]:
    writer = CheckWriter(options.output, _header(options, start_wall_ns))
    for row in rows:
        writer.write(row)
    footer: dict[str, Any] = {
        "answers": len(rows),
        "errors": sum(1 for r in rows if r.error),
        "scorer_failures": scorer_failures,
    }
    if interrupted:
        footer["interrupted"] = True
    writer.close(**footer)
    return footer


async def _ask_target(
    options: CheckOptions, target: CheckTarget, headers: dict[str, str], progress: Progress | None
) -> list[list[Answer]]:
    prompts = options.prompts.prompts
    model = options.models.get(target.label, "")
    bodies = [request_body(p, options.sampling, model, target.flavor) for p in prompts]
    urls = [target.url.rstrip("/") + PATHS[p.endpoint] for p in prompts]
    gate = asyncio.Semaphore(options.concurrency)
    connector = aiohttp.TCPConnector(limit=options.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> Answer:
            async with gate:
                return await send(session, urls[i], bodies[i], headers, options.timeout_s)

        for i in range(min(options.warmup, len(prompts))):
            await one(i)  # warm-up: caches, compilation, connections; the answer is not kept
        started = clock.now_ns()
        rounds = []
        for _ in range(options.repeat):
            rounds.append(await asyncio.gather(*(one(i) for i in range(len(prompts)))))
    if progress is not None:
        errors = sum(1 for answers in rounds for a in answers if a.error)
        seconds = (clock.now_ns() - started) / 1e9
        progress(f"{target.label}: {len(prompts) * options.repeat} answers, {errors} errors, {seconds:.1f} s")
    return [[rounds[r][i] for r in range(options.repeat)] for i in range(len(prompts))]


def _rows(
    options: CheckOptions, answers: Answers, scores: dict[tuple[str, int, int], str | None]
) -> list[CheckRow]:
    """Rows of every target that answered, in target, prompt, repeat order."""
    hasher = scoring.Hasher()
    baseline = answers.get(options.baseline_label)
    rows = []
    for target in options.targets:
        if target.label not in answers:
            continue
        for prompt in options.prompts.prompts:
            first = baseline[prompt.index][0] if baseline is not None else None
            baseline_text = scoring.comparable_text(first) if first is not None and first.ok else None
            for repeat, answer in enumerate(answers[target.label][prompt.index]):
                score = scores.get((target.label, prompt.index, repeat))
                rows.append(_row(options, target.label, prompt, repeat, answer, hasher, baseline_text, score))
    return rows


def _row(
    options: CheckOptions,
    label: str,
    prompt: Prompt,
    repeat: int,
    answer: Answer,
    hasher: scoring.Hasher,
    baseline_text: str | None,
    score: str | None,
) -> CheckRow:
    facts: dict[str, Any] = dict(
        target=label,
        prompt_index=prompt.index,
        prompt_id=prompt.id,
        repeat=repeat,
        endpoint=prompt.endpoint,
        messages=prompt.messages,
        has_stop=prompt.has_stop,
        structure=prompt.structure,
        has_reference=prompt.reference is not None,
        status=answer.status,
        error=answer.error,
        error_message=answer.error_message,
        e2e_ns=answer.e2e_ns,
    )
    if not answer.ok:
        return CheckRow(**facts)
    text = scoring.comparable_text(answer)
    json_valid, schema_valid = scoring.json_checks(prompt, answer)
    reference_exact, reference_similarity = scoring.reference_checks(prompt, answer)
    return CheckRow(
        **facts,
        prompt_tokens=answer.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        finish_reason=answer.finish_reason,
        output_chars=len(text),
        output_hash=hasher(answer),
        tool_calls=len(answer.tool_calls),
        json_valid=json_valid,
        schema_valid=schema_valid,
        tool_valid=scoring.tool_check(prompt, answer),
        similarity_ppm=scoring.similarity_ppm(text, baseline_text) if baseline_text is not None else -1,
        reference_exact=reference_exact,
        reference_similarity_ppm=reference_similarity,
        score=score or "",
        output=text if options.keep_outputs else "",
    )


async def _user_scores(options: CheckOptions, answers: Answers) -> dict[tuple[str, int, int], str | None]:
    """The scorer's number per answer (None where it failed); the first failure is shown."""
    if not options.score_command:
        return {}
    argv = scorer.split_command(options.score_command)
    gate = asyncio.Semaphore(4)
    first_failure: list[str] = []

    async def one(prompt: Prompt, answer: Answer) -> str | None:
        async with gate:
            try:
                return await scorer.score(argv, prompt, scoring.comparable_text(answer), options.timeout_s)
            except scorer.ScorerError as e:
                if not first_failure:
                    first_failure.append(str(e))
                return None

    keys, jobs = [], []
    for label, per_prompt in answers.items():
        for prompt in options.prompts.prompts:
            for repeat, answer in enumerate(per_prompt[prompt.index]):
                if answer.ok:
                    keys.append((label, prompt.index, repeat))
                    jobs.append(one(prompt, answer))
    values = await asyncio.gather(*jobs)
    if first_failure:
        failed = sum(1 for v in values if v is None)
        print(
            f"replayproxy check: the scorer failed on {failed} of {len(values)} answers; first: "
            f"{first_failure[0]}",
            file=sys.stderr,
        )
    return dict(zip(keys, values, strict=True))


def _header(options: CheckOptions, start_wall_ns: int) -> CheckHeader:
    return CheckHeader(
        start_wall_ns=start_wall_ns,
        targets=options.targets,
        baseline=options.baseline_label,
        sampling=options.sampling.to_record(),
        repeat=options.repeat,
        warmup=options.warmup,
        concurrency=options.concurrency,
        prompts=options.prompts.source,
        prompts_digest=options.prompts.digest,
        prompt_count=len(options.prompts.prompts),
        keep_outputs=options.keep_outputs,
        scored=bool(options.score_command),
        replayproxy_version=__version__,
        host=socket.gethostname(),
    )
