"""BurstGPT (HPMLL/BurstGPT, KDD'25): Azure OpenAI ChatGPT / GPT-4 usage of one organization.

CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`; `BurstGPT_3*` files add
`Session ID` and `Elapsed time` after Timestamp. Timestamp is seconds from 0:00 of the first day;
`Response tokens` = 0 marks a failed request (kept as error "other", or left out with
--drop-failed); `Elapsed time` (submission to complete response, s) becomes the production E2E.
No prefix information.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replayproxy.formats.csv_rows import CsvBatches, csv_problem, same_width
from replayproxy.formats.importing import (
    BadLines,
    Coded,
    Imported,
    ImportOptions,
    SpilledColumns,
    TurnsInArrival,
    drop_rows,
    keep_good,
    key_of,
)
from replayproxy.shape import MAX_OFFSET_S, MAX_TOKENS

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
SESSION, ELAPSED = "Session ID", "Elapsed time"


def read(path: Path, options: ImportOptions) -> Imported:
    """Rows a batch at a time: numbers per request go to temporary files with their batch, strings
    as codes into the distinct names."""
    bad = BadLines(str(path), options.skip_bad)
    failed_requests = dropped = 0
    session_keys: dict[str, int] = {}
    with CsvBatches(path, COLUMNS, bad) as batches:
        where = batches.where
        spilled = SpilledColumns(
            **dict.fromkeys(("offset_ns", "input_tokens", "output_tokens", "status"), np.int64),
            error=np.uint8,
            **({"e2e_ns": np.int64} if ELAPSED in where else {}),
            **({"session": np.uint64} if SESSION in where else {}),
        )  # fmt: skip
        for rows, line_nos in batches:
            batch, kept_rows, dropped_now = _batch(rows, line_nos, where, options.drop_failed, bad)
            dropped += dropped_now
            failed = batch["outputs"] == 0
            failed_requests += int(failed.sum())
            spilled.add(
                offset_ns=np.rint(batch["seconds"] * 1e9).astype(np.int64),
                input_tokens=batch["inputs"],
                output_tokens=batch["outputs"],
                status=np.where(failed, 0, 200),
                error=failed.astype(np.uint8),
            )
            if ELAPSED in where:
                elapsed = batch["elapsed"]
                seconds_run = np.clip(elapsed, 0, MAX_OFFSET_S)  # a negative elapsed time stays unknown (-1)
                spilled.add(e2e_ns=np.where(elapsed > 0, np.rint(seconds_run * 1e9), -1).astype(np.int64))
            if not options.model:
                spilled.add_strings("model", (row[where["Model"]].strip() for row in kept_rows))
            if SESSION in where:
                labels = (_session_key(row[where[SESSION]].strip(), session_keys) for row in kept_rows)
                spilled.add(session=np.fromiter(labels, np.uint64, len(kept_rows)))
    columns = spilled.result()
    columns["error"] = Coded(np.array(["", "other"], dtype=object), columns["error"])
    columns.setdefault("model", options.model)
    if SESSION in where:
        columns["turn"] = TurnsInArrival(columns["session"])
    return Imported(
        source="burstgpt",
        offset_ns=columns.pop("offset_ns"),
        input_tokens=columns.pop("input_tokens"),
        output_tokens=columns.pop("output_tokens"),
        bad=bad,
        columns=columns,
        extra={"failed_requests": failed_requests, "dropped_failed": dropped},
    )


def _batch(
    rows: list[list[str]], line_nos: list[int], where: dict[str, int], drop_failed: bool, bad: BadLines
) -> tuple[dict[str, np.ndarray], list[list[str]], int]:
    """One batch's numbers by field, the rows kept (for their strings) and how many failed were dropped."""
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
    past = (
        (counts[0] > MAX_TOKENS)
        | (counts[1] > MAX_TOKENS)
        | (np.stack([seconds, *values[3:]]) > MAX_OFFSET_S).any(axis=0)
    )
    wrong = (
        ~finite
        | past
        | (seconds < 0)
        | (counts[0] < 0)
        | (counts[1] < 0)
        | (counts[0] % 1 != 0)
        | (counts[1] % 1 != 0)
    )
    inputs, outputs = (np.where(wrong, -1, c).astype(np.int64) for c in counts)  # cast once in range
    keep = drop_rows(wrong, lambda i: f"bad numbers in {rows[i]}", line_nos, bad)
    dropped = 0
    if drop_failed:
        failed = outputs[keep] == 0
        dropped = int(failed.sum())
        keep = keep[~failed]
    batch = {"seconds": seconds[keep], "inputs": inputs[keep], "outputs": outputs[keep]}
    if ELAPSED in where:
        batch["elapsed"] = values[3][keep]
    return batch, [rows[i] for i in keep.tolist()], dropped


def _session_key(label: str, keys: dict[str, int]) -> int:
    """A session's keyed number (0: no session), computed once per distinct label."""
    if not label:
        return 0
    key = keys.get(label)
    if key is None:
        key = keys[label] = key_of(label)
    return key


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
