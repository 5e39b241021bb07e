"""BurstGPT (HPMLL/BurstGPT, KDD'25): Azure OpenAI ChatGPT / GPT-4 usage of one organization.

CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`; `BurstGPT_3*` files add
`Session ID` and `Elapsed time` after Timestamp. Timestamp is seconds from 0:00 of the first day;
`Response tokens` = 0 marks a failed request (kept as error "other", or left out with
--drop-failed); `Elapsed time` (submission to complete response, s) becomes the production E2E.
No prefix information.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from replayproxy.formats.importing import (
    BadLines,
    Imported,
    ImportOptions,
    csv_problem,
    drop_rows,
    keep_good,
    key_of,
    read_csv,
    same_width,
    turns_of,
)

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
SESSION, ELAPSED = "Session ID", "Elapsed time"


def read(path: Path, options: ImportOptions) -> Imported:
    bad = BadLines(str(path), options.skip_bad)
    where, rows, line_nos = read_csv(path, COLUMNS, bad)
    numeric = [where[name] for name in ("Timestamp", "Request tokens", "Response tokens")]
    if ELAPSED in where:
        numeric.append(where[ELAPSED])
    try:
        same_width(rows, len(where))
        values = _numbers(rows, numeric)
    except ValueError:
        check = csv_problem(len(where), lambda row: _problem(row, numeric))
        rows, line_nos = keep_good(rows, line_nos, check, bad)
        values = _numbers(rows, numeric)
    seconds = values[0]
    finite = np.isfinite(np.stack(values)).all(axis=0)
    counts = [np.where(finite, v, -1.0) for v in values[1:3]]
    inputs, outputs = counts[0].astype(np.int64), counts[1].astype(np.int64)
    wrong = (
        ~finite | (seconds < 0) | (inputs < 0) | (outputs < 0) | (counts[0] % 1 != 0) | (counts[1] % 1 != 0)
    )
    keep = drop_rows(wrong, lambda i: f"bad numbers in {rows[i]}", line_nos, bad)
    failed = outputs == 0
    dropped = int(failed[keep].sum()) if options.drop_failed else 0
    if options.drop_failed:
        keep = keep[~failed[keep]]
    columns: dict[str, Any] = {
        "model": options.model or [rows[i][where["Model"]].strip() for i in keep],
        "error": np.where(failed[keep], "other", "").astype(object),
        "status": np.where(failed[keep], 0, 200),
    }
    if ELAPSED in where:
        columns["e2e_ns"] = np.where(values[3][keep] > 0, np.rint(values[3][keep] * 1e9), -1).astype(np.int64)
    if SESSION in where:
        sessions = np.array(
            [key_of(rows[i][where[SESSION]].strip()) if rows[i][where[SESSION]].strip() else 0 for i in keep],
            np.uint64,
        )
        order = np.argsort(seconds[keep], kind="stable")
        turns = np.empty(len(keep), np.int64)
        turns[order] = turns_of(sessions[order])
        columns.update(session=sessions, turn=turns)
    return Imported(
        source="burstgpt",
        offset_ns=np.rint(seconds[keep] * 1e9).astype(np.int64),
        input_tokens=inputs[keep],
        output_tokens=outputs[keep],
        bad=bad,
        columns=columns,
        extra={"failed_requests": int(failed[keep].sum()), "dropped_failed": dropped},
    )


def _numbers(rows: list[list[str]], at: list[int]) -> list[np.ndarray]:
    """Float columns (raises ValueError on a cell that is not a number)."""
    if not rows:
        return [np.zeros(0) for _ in at]
    return [np.array([row[i] for row in rows], dtype=object).astype(np.float64) for i in at]


def _problem(row: list[str], at: list[int]) -> str | None:
    for i in at:
        try:
            float(row[i])
        except ValueError:
            return f"{row[i]!r} is not a number"
    return None
