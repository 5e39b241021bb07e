"""AIPerf single-turn JSON lines: `{"text": prompt, "timestamp": ms, "output_length": n}` per request.

For tools that send literal text: the prompts are the replayer's own synthesis (same lengths and
shared prefixes as a replay), injected by the export command because formats may not import the
replayer. AIPerf's `SingleTurn` model (aiperf/dataset/loader/models.py) takes `timestamp` as
int | float milliseconds and `output_length` > 0; `--fixed-schedule` sends at those times.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from replayproxy.errors import BadOption
from replayproxy.formats.exporting import (
    ExportOptions,
    ExportResult,
    output_lengths,
    plain_numbers,
    relative_ms,
    write_json_lines,
)
from replayproxy.trace import Columns


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    if options.prompts is None:
        raise BadOption("aiperf needs the replayer's prompt synthesis; run it via `replayproxy export`")
    rows = write_json_lines(path, _rows(cols, options.prompts(cols)))
    command = (
        f"AIPerf:   aiperf profile --model {options.model} --url {options.url} --endpoint-type chat "
        f"--streaming --input-file {path} --custom-dataset-type single_turn --fixed-schedule "
        "--extra-inputs ignore_eos:true"
    )
    note = (
        "note: prompts are text: the server's tokenizer decides their token counts "
        "(the replayer's synthesis aims at the recorded input lengths)"
    )
    return ExportResult(rows, [command, note])


def _rows(cols: Columns, prompts: Iterable[str]) -> Iterator[dict[str, Any]]:
    stamps = plain_numbers(relative_ms(cols))
    outputs = output_lengths(cols)[0].tolist()
    for prompt, timestamp, output in zip(prompts, stamps, outputs, strict=True):
        yield {"text": prompt, "timestamp": timestamp, "output_length": output}
