"""`replayproxy export TRACE... --format F -o FILE`: traces for other tools, with their command lines.

`replayproxy export RESULT.rpr... --format csv|jsonl|parquet -o FILE` writes per-request result rows.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson

from replayproxy import results, trace, workload_stats
from replayproxy.errors import BadInputFile, BadOption, user_file
from replayproxy.formats.blocks import source_blocks
from replayproxy.formats.exporting import ExportOptions, failed, select_rows
from replayproxy.formats.registry import exporters, listing, writer
from replayproxy.formats.rows_out import ROW_FORMATS, write_rows
from replayproxy.replay import flavors, plan, prompt_parts
from replayproxy.trace.reuse import prefix_reuse

# Analysis tables keep every request with its status and error; workload formats send only successes.
KEEPS_EVERY_REQUEST = frozenset({"csv", "parquet"})
# The trace fields each format's writer reads, besides what every export reads (the failure filter,
# the model): only these are loaded, so a long trace's other columns are never held. A format not
# listed loads every field. A field left out fails loudly (AttributeError), never silently.
EVERY_EXPORT_READS = ("status", "error", "model")
_LENGTHS = ("input_tokens", "prefix_units", "output_tokens", "max_tokens")
FIELDS_READ: dict[str, tuple[str, ...]] = {
    "mooncake": (*_LENGTHS, "session", "think_ns", "e2e_ns"),
    "bailian": (*_LENGTHS, "session", "turn", "request_type"),
    "jsonl": (*_LENGTHS, "endpoint", "stream", "turn", "session"),
    "azure": _LENGTHS,
    "burstgpt": _LENGTHS,
    # the profile's fits and the `inspect` figures it carries (workload_stats)
    "profile": (*_LENGTHS, "endpoint", "stream", "session", "ttft_ns", "e2e_ns"),
}
EXAMPLES = (
    "replayproxy export traces/ --format mooncake -o trace.jsonl",
    "replayproxy export prod.rpt --format vllm-custom -o prompts.jsonl --model my-model",
    "replayproxy export vllm.rpr sglang.rpr --format parquet -o requests.parquet",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    formats = exporters()
    parser.epilog = (
        listing(formats)
        + "\n\nColumns, units and consumer rules: docs/formats.md"
        + f"\nResult files (.rpr): one row per request as {' | '.join(ROW_FORMATS)}; docs/results-format.md"
    )
    parser.add_argument(
        "traces", nargs="+", metavar="TRACE", help="trace files, directories or globs; or RESULT.rpr files"
    )
    parser.add_argument("--format", "-f", required=True, metavar="FORMAT", help="output format (below)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="file to write")
    parser.add_argument(
        "--block-size",
        type=int,
        help="tokens per hash id (default: the trace's block size; with char blocks the format's,"
        " mooncake 512, bailian 16, jsonl 16)",
    )
    parser.add_argument(
        "--sessions", action="store_true", help="mooncake: session_id and delay for follow-up turns"
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json (or its model directory, or a .gguf) of the target: text prompts get "
        "exact lengths for it (default: none)",
    )
    parser.add_argument(
        "--model", help="model name in the printed command lines (default: the trace's, if it has one)"
    )
    parser.add_argument(
        "--include-failed",
        action="store_true",
        help="keep requests that failed at the source (left out by default, except csv/parquet)",
    )
    parser.add_argument(
        "--url", default="http://localhost:8000", help="server URL in the printed command lines"
    )


def run(args: argparse.Namespace) -> int:
    if all(str(path).endswith(results.SUFFIX) for path in args.traces):
        return _export_results(args)
    write = writer(args.format)
    if args.block_size is not None and args.block_size <= 0:
        raise BadOption(f"--block-size must be positive, got {args.block_size}")
    read = FIELDS_READ.get(args.format)
    fields = None if read is None else (*EVERY_EXPORT_READS, *read)
    # numbers, hashes and chunk gaps stay in mapped temporary files: writers go through them a chunk at a time
    cols = trace.load(args.traces, fields=fields, scalars_on_disk=True)
    if not len(cols):
        raise BadInputFile("the traces hold no readable requests" + _losses(cols.report))
    notes: list[str] = []
    bad = failed(cols)
    if bad.any() and not args.include_failed and args.format not in KEEPS_EVERY_REQUEST:
        if bad.all():
            raise BadInputFile(f"all {len(cols)} requests failed at the source (--include-failed keeps them)")
        cols = select_rows(cols, np.flatnonzero(~bad))
        notes.append(
            f"note: left out {int(bad.sum())} requests that failed at the source"
            " (--include-failed keeps them)"
        )
    model, model_note = _model(cols, args.model)
    notes += model_note
    options = ExportOptions(
        block_size=args.block_size,
        sessions=args.sessions,
        model=model,
        url=args.url,
        inspect=workload_stats.workload_stats(cols) if args.format == "profile" else None,
        prompts=functools.partial(replayer_prompts, tokenizer=args.tokenizer),
    )
    with user_file(args.output):
        result = write(cols, args.output, options)
    print(f"wrote {result.rows} requests to {args.output} ({args.format})")
    for note in notes:
        print(note)
    for warning in cols.report.warnings:
        print(f"note: {warning}")
    if cols.report.lost_records:
        print(f"note: {cols.report.lost_records} records in damaged frames could not be read or exported")
    for note in result.notes:
        print(note)
    if result.reuse is not None and result.block_size is not None:
        _warn_lost_sharing(cols, result.reuse, result.block_size)
    return 0


REUSE_TOLERANCE = 0.01  # an export's prefix reuse may differ from the trace's by one point


def _warn_lost_sharing(cols: trace.Columns, exported: float, block: int) -> None:
    """Blocks longer than the shared prefixes turn shared tokens into unshared ones: say so on stderr,
    with both figures and the option that keeps them."""
    recorded = prefix_reuse(cols)
    if recorded is None or abs(recorded - exported) <= REUSE_TOLERANCE:
        return
    size, unit = source_blocks(cols)
    keep = (
        f"--block-size {size} (the trace's block size) keeps it"
        if unit == "token" and block != size
        else "a smaller --block-size keeps more of it"
    )
    print(
        f"replayproxy export: warning: prefix reuse is {exported:.1%} in the export with {block}-token"
        f" ids, {recorded:.1%} in the trace; {keep}",
        file=sys.stderr,
    )


def _model(cols: trace.Columns, given: str | None) -> tuple[str, list[str]]:
    """The model for the printed commands, and a note when the trace names several.

    Counted over the column's objects (the few distinct names are shared), not as a fixed-width
    string array of every row.
    """
    if given:
        return given, []
    tally = collections.Counter(map(str, cols.model.tolist()))
    names = sorted(tally)
    named = [(n, tally[n]) for n in names if n]
    if len(named) == 1 and len(names) == 1:
        return named[0][0], []
    if not named:
        return "MODEL", []
    mix = ", ".join(f"{n} {c}" for n, c in sorted(named, key=lambda x: -x[1]))
    return "MODEL", [f"note: the trace names several models ({mix}); these formats carry one --model"]


def _losses(report: trace.ReadReport) -> str:
    """What a read skipped, for the error when nothing readable is left."""
    if not report.warnings and not report.lost_records:
        return ""
    lost = f"{report.lost_records} records lost; " if report.lost_records else ""
    return f" ({lost}{'; '.join(report.warnings)})"


def _export_results(args: argparse.Namespace) -> int:
    files = results.load_results(args.traces)
    with user_file(args.output):
        count = write_rows(results.request_rows(files), results.ROW_KINDS, args.format, args.output)
    print(f"wrote {count} requests of {len(files)} run(s) to {args.output} ({args.format})")
    return 0


def replayer_prompts(cols: trace.Columns, tokenizer: str | None = None) -> Iterator[str]:
    """Every request's prompt exactly as the replayer sends it to /v1/completions (text, default seed).

    The replayer's synthesis (replay.plan + replay.synth) is used, not copied: formats may not
    import replay, so this glue module hands it to the vllm-custom writer. With a tokenizer the
    prompts are exact for it (words of one token each, its special tokens counted). One prompt at
    a time, so a writer never holds them all.
    """
    endpoint = np.full(len(cols), "completions", dtype=object)
    completions = dataclasses.replace(cols, scalar={**cols.scalar, "endpoint": endpoint})
    book = None
    if tokenizer:
        from replayproxy.replay.hf_tokenizer import LocalTokenizer

        book = asyncio.run(prompt_parts.measure(LocalTokenizer(tokenizer), []))
    options = plan.PlanOptions(book=book)
    for prepared in plan.iter_prepared(completions, np.arange(len(cols)), flavors.get("openai"), options):
        yield str(orjson.loads(prepared.body)["prompt"])
