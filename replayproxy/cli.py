"""Command-line entry point: one subcommand per job, each delegating to one module's `run`.

Each feature package exposes `add_arguments(parser)` and `run(args) -> int` in a `command`
module, imported only when its subcommand is chosen so `--help` and small commands stay fast.
The simulated engine is started in a fresh interpreter (`python -m replayproxy.sim`) because
product code must not import it (DESIGN.md, import table).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

from replayproxy import __version__
from replayproxy.errors import UserError


class Command(NamedTuple):
    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "proxy": Command("replayproxy.proxy.command", "run the sidecar recorder in front of a live server"),
    "replay": Command(
        "replayproxy.replay.command", "reissue a trace against a target engine with its timing"
    ),
    "compare": Command(
        "replayproxy.compare_command", "replay a trace against candidates, runs interleaved, then report"
    ),
    "report": Command("replayproxy.report.command", "compare replay and output-check results side by side"),
    "check": Command(
        "replayproxy.check.command", "send the same prompts to every candidate and compare the answers"
    ),
    "sweep": Command("replayproxy.sweep.command", "replay a trace at rising speeds and find the knee"),
    "tune": Command(
        "replayproxy.tune.command", "tune each engine on a trace, then compare best against best"
    ),
    "inspect": Command("replayproxy.inspect_command", "print the workload statistics of traces"),
    "synth": Command("replayproxy.synth_command", "write a synthetic trace (or one scaled from a profile)"),
    "export": Command("replayproxy.formats.export_command", "convert traces to other tools' formats"),
    "import": Command("replayproxy.formats.import_command", "convert public traces into a replayproxy trace"),
    "capacity": Command("replayproxy.capacity.command", "KV-cache / GPU-memory fit of a model and a trace"),
    "demo": Command("replayproxy.demo", "record, replay against two candidates and compare, all locally"),
}
SIM_HELP = "start the simulated OpenAI-compatible engine (test double)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """One default style everywhere: `(default: X)` after every option's help that has a default;
    options whose default is computed or absent say it in their own text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        absent = default is None or isinstance(default, bool) or default in ("", [], argparse.SUPPRESS)
        if "(default:" in text or not action.option_strings or action.required or absent:
            return text
        return f"{text} (default: %(default)s)"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (the project's rule), not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="replayproxy",
        description="Record LLM traffic shapes, replay them against candidate engines, compare.",
    )
    parser.add_argument("--version", action="version", version=f"replayproxy {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, description=command.help, add_help=False)
    sub.add_parser("sim", help=SIM_HELP, add_help=False)
    return parser


def _run_sim(argv: Sequence[str]) -> int:
    os.execv(sys.executable, [sys.executable, "-m", "replayproxy.sim", *argv])


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    """The subcommand's own parser; its help ends with the module's EXAMPLES."""
    module = importlib.import_module(COMMANDS[name].module)
    parser = OneLineParser(
        prog=f"replayproxy {name}",
        description=COMMANDS[name].help,
        formatter_class=HelpFormatter,
    )
    module.add_arguments(parser)
    examples = "examples:\n" + "\n".join(f"  {line}" for line in module.EXAMPLES)
    parser.epilog = f"{parser.epilog}\n\n{examples}" if parser.epilog else examples
    return parser


def _dispatch(name: str, argv: Sequence[str], verbose: bool) -> int:
    module = importlib.import_module(COMMANDS[name].module)
    args = subcommand_parser(name).parse_args(argv)
    args.verbose = verbose
    code: int = module.run(args)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Global options come before the subcommand; everything after it belongs to the subcommand.
    split = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
    top = parser.parse_args(argv[: split + 1])
    rest = argv[split + 1 :]
    logging.basicConfig(
        level=logging.DEBUG if top.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if top.command is None:
        parser.print_help()
        return 2
    if top.command == "sim":
        return _run_sim(rest)
    try:
        return _dispatch(top.command, rest, top.verbose)
    except BrokenPipeError:
        # The reader went away (e.g. `replayproxy inspect ... | head`): not an error of ours.
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print(f"replayproxy {top.command}: interrupted", file=sys.stderr)
        return 130
    except UserError as e:
        print(f"replayproxy {top.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug: say so in one line; -v shows where
        if isinstance(e, OSError) and e.errno in _DISK_FULL:  # not a bug: the user can make room
            print(f"replayproxy {top.command}: error: {_disk_full(e)}", file=sys.stderr)
            return 2
        if top.verbose:
            traceback.print_exc()
        hint = "" if top.verbose else "; run with -v for the traceback"
        print(
            f"replayproxy {top.command}: internal error (a bug): {type(e).__name__}: {_one_line(e)}{hint}",
            file=sys.stderr,
        )
        return 1


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(e: OSError) -> str:
    """Which disk filled up: a named file's, or the one that holds temporary files (imports and
    exports keep long columns in unlinked temporary files there)."""
    where = f" writing {e.filename}" if e.filename else ""
    return (
        f"{e.strerror or 'no space left on device'}{where}; temporary files go to"
        f" {tempfile.gettempdir()} (set TMPDIR to a disk with room)"
    )


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return " ".join(text.split())


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
