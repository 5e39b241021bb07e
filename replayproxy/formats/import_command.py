"""`replayproxy import FILE --format F -o TRACE.rpt`: a public trace becomes a replayable trace."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from replayproxy import clock
from replayproxy.errors import BadInputFile, BadOption, user_file
from replayproxy.formats.importing import ImportOptions, paused_gc, span_warning, write_imported
from replayproxy.formats.registry import importers, listing, reader
from replayproxy.replay import progress
from replayproxy.shape import MAX_OFFSET_S

EXAMPLES = (
    "replayproxy import mooncake_trace.jsonl --format mooncake -o mooncake.rpt",
    "replayproxy import AzureLLMInferenceTrace_conv.csv --format azure -o azure.rpt --skip-bad",
    "replayproxy import ServeGen/data/language/m-small --format servegen --duration 600 --seed 1 -o sg.rpt",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    formats = importers()
    parser.epilog = listing(formats) + "\n\nUnits, quirks and field mappings: docs/formats.md"
    parser.add_argument("file", type=Path, metavar="FILE", help="the file to import")
    parser.add_argument("--format", "-f", required=True, metavar="FORMAT", help="the file's format (below)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="trace file to write (.rpt)")
    parser.add_argument(
        "--block-size",
        type=int,
        help="tokens per hash id (default: the format's, mooncake 512, bailian 16, jsonl 16)",
    )
    parser.add_argument(
        "--time-unit",
        choices=("ms", "s"),
        help="numeric timestamps' unit (default: the format's, mooncake ms, bailian s)",
    )
    parser.add_argument(
        "--model", default="", help="model name to record, for formats without one (default: none)"
    )
    parser.add_argument("--skip-bad", action="store_true", help="skip malformed lines and count them")
    parser.add_argument(
        "--seed", type=int, default=0, help="servegen: seed of the sampled workload (default: 0)"
    )
    parser.add_argument(
        "--start", type=float, default=0.0, metavar="S", help="servegen: first second sampled (default: 0)"
    )
    parser.add_argument(
        "--duration", type=float, metavar="S", help="servegen: seconds sampled (default: 600, one window)"
    )
    parser.add_argument(
        "--drop-failed", action="store_true", help="leave out requests the source marks failed"
    )
    parser.add_argument(
        "--progress",
        choices=progress.MODES,
        default="auto",
        help="a spinner on a terminal (tty), a line every 10 s (log) or none",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress (--progress none)")


def run(args: argparse.Namespace) -> int:
    read = reader(args.format)
    if args.block_size is not None and args.block_size <= 0:
        raise BadOption(f"--block-size must be positive, got {args.block_size}")
    options = ImportOptions(
        skip_bad=args.skip_bad,
        block_size=args.block_size,
        time_unit=args.time_unit,
        model=args.model,
        drop_failed=args.drop_failed,
        seed=args.seed,
        start_s=args.start,
        duration_s=args.duration,
    )
    if not 0 <= args.start <= MAX_OFFSET_S or (
        args.duration is not None and not 0 < args.duration <= MAX_OFFSET_S
    ):
        raise BadOption(
            f"--start must be within 0..{MAX_OFFSET_S:g} s and --duration within (0, {MAX_OFFSET_S:g}] s"
        )
    mode = progress.resolve(args.progress, args.quiet, sys.stderr)
    size_mib = args.file.stat().st_size / 2**20 if args.file.is_file() else 0.0
    with paused_gc():
        with progress.stage(mode, "import", f"reading {args.file} ({size_mib:.1f} MiB, {args.format})"):
            with user_file(args.file):
                imported = read(args.file, options)
        if not len(imported):
            raise BadInputFile(f"{args.file}: no requests to import")
        with progress.stage(mode, "import", f"writing {len(imported)} requests to {args.output}"):
            with user_file(args.output):
                written = write_imported(imported, args.output, clock.wall_ns)
    print(f"imported {written} requests from {args.file} ({args.format}) into {args.output}")
    if imported.bad.count:
        print(f"skipped {imported.bad.count} malformed lines; first: {imported.bad.first}")
    for note in imported.notes:
        print(note)
    for warning in imported.warnings + span_warning(imported):
        print(f"warning: {warning}")
    return 0
