"""vLLM `custom` dataset export: `{"prompt": ...}` JSON lines for tools that take only prompts.

The prompts are the replayer's own synthesis (completions layout: one prompt string per request,
same lengths and shared prefixes), injected by the export command because formats may not import
the replayer. `vllm bench serve --dataset-name custom` takes one output length for all requests
and paces with a rate and a gamma burstiness, so the printed command uses the trace's median
output, mean rate and inter-arrival CV; the file keeps arrival order (--disable-shuffle).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replayproxy.errors import BadOption
from replayproxy.formats.exporting import ExportOptions, ExportResult, output_lengths, write_json_lines
from replayproxy.trace import Columns


def write(cols: Columns, path: Path, options: ExportOptions) -> ExportResult:
    if options.prompts is None:
        raise BadOption("vllm-custom needs the replayer's prompt synthesis; run it via `replayproxy export`")
    prompts = options.prompts(cols)
    rows = write_json_lines(path, ({"prompt": prompt} for prompt in prompts))
    outputs, _ = output_lengths(cols)
    output_p50 = int(np.median(outputs)) if len(outputs) else 1
    seconds = (
        (cols.offset_ns.astype(np.float64) - float(cols.offset_ns[0])) / 1e9 if len(cols) else np.zeros(0)
    )
    gaps = np.diff(seconds)
    rate = (len(seconds) - 1) / seconds[-1] if len(seconds) > 1 and seconds[-1] > 0 else 1.0
    cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 1.0
    burstiness = 1 / max(cv, 1e-3) ** 2
    notes = [
        f"vLLM: vllm bench serve --backend openai --endpoint /v1/completions --base-url {options.url} "
        f"--model {options.model} --dataset-name custom --dataset-path {path} --num-prompts {rows} "
        f"--custom-output-len {output_p50} --skip-chat-template --disable-shuffle --ignore-eos "
        f"--request-rate {rate:.4g} --burstiness {burstiness:.4g}",
        f"note: one output length for all requests (the median, {output_p50}; "
        f"p90 {int(np.percentile(outputs, 90)) if len(outputs) else 1}); arrivals become a gamma process "
        f"with the trace's mean rate and inter-arrival CV {cv:.3g}, not its recorded times",
    ]
    if path.suffix != ".jsonl":
        notes.append(f"note: vLLM reads custom datasets only from files ending in .jsonl, not {path.name}")
    return ExportResult(rows, notes)
