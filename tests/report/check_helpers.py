"""Hand-made check files for the report's tests: two targets, four prompts, rows as asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replayproxy.results import CheckHeader, CheckRow, CheckTarget, CheckWriter

PROMPTS = ("p0", "p1", "p2", "p3")


def write_check(path: Path, rows: list[CheckRow], repeat: int = 2, keep: bool = False) -> Path:
    header = CheckHeader(
        start_wall_ns=0,
        targets=(CheckTarget("A", "http://a"), CheckTarget("B", "http://b")),
        baseline="A",
        sampling={"temperature": 0.0, "seed": 1, "max_tokens": 32},
        repeat=repeat,
        prompt_count=len(PROMPTS),
        keep_outputs=keep,
    )
    writer = CheckWriter(path, header)
    for row in rows:
        writer.write(row)
    writer.close()
    return path


def row(target: str, prompt: int, repeat: int, **fields: Any) -> CheckRow:
    values: dict[str, Any] = dict(
        messages=2,
        prompt_tokens=20,
        completion_tokens=10,
        finish_reason="stop",
        output_hash=f"h{prompt}",
        similarity_ppm=1_000_000,
        status=200,
        output_chars=30,
    )
    values.update(fields)
    return CheckRow(target, prompt, PROMPTS[prompt], repeat, **values)


def both(**b_fields: Any) -> list[CheckRow]:
    """A answers every prompt the same twice; B likewise, with b_fields on every row."""
    rows = [row("A", p, r) for p in range(4) for r in range(2)]
    return rows + [row("B", p, r, **b_fields) for p in range(4) for r in range(2)]
