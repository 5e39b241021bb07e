"""Every subcommand's --help reads the same way: one default style, every default shown, positionals
named TRACE / RESULT, and worked examples at the end."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from replayproxy import cli
from tests.cli import CliResult, run_cli

FLAG_ACTIONS = (argparse._StoreTrueAction, argparse._StoreConstAction, argparse._HelpAction,
                argparse._VersionAction, argparse.BooleanOptionalAction)  # fmt: skip
POSITIONALS = {"TRACE", "RESULT", "TRACE|RESULT", "FILE", "PATH"}


def parser_of(name: str) -> argparse.ArgumentParser:
    return cli.subcommand_parser(name)


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_option_shows_its_default_in_one_style(name: str) -> None:
    parser = parser_of(name)
    formatter = parser._get_formatter()
    for action in parser._actions:
        text = formatter._get_help_string(action)  # type: ignore[attr-defined]
        assert text, f"{name} {action.option_strings or action.dest}: no help"
        assert not re.search(r"\(default [^:]|\(defaults? to", text), f"{name}: {text!r}: say '(default: X)'"
        if not action.option_strings:
            named = action.metavar
            assert named in POSITIONALS, f"{name}: positional {action.dest!r} named {named!r}"
            continue
        if isinstance(action, FLAG_ACTIONS) or action.required or "(required)" in text:
            assert "(default:" not in text or isinstance(action, argparse.BooleanOptionalAction), (name, text)
            continue
        assert "(default: " in text, f"{name} {action.option_strings[0]}: help shows no default: {text!r}"


@pytest.mark.parametrize("name", [*sorted(cli.COMMANDS), "sim"])
def test_every_help_ends_with_worked_examples(name: str) -> None:
    if name == "sim":  # `replayproxy sim` execs the engine's own entry point: a real process
        argv = [sys.executable, "-m", "replayproxy", name, "--help"]
        done: CliResult | subprocess.CompletedProcess[str] = subprocess.run(
            argv, capture_output=True, text=True, timeout=60
        )
    else:
        done = run_cli(name, "--help")
    assert done.returncode == 0, done.stderr
    tail = done.stdout.rstrip().split("\nexamples:\n")
    assert len(tail) == 2, f"{name} --help has no examples section at its end"
    examples = [line.strip() for line in tail[1].splitlines() if line.strip()]
    assert 2 <= len(examples) <= 4, examples
    assert all(e.startswith("replayproxy ") for e in examples), examples
    assert sum(f"{e} ".startswith(f"replayproxy {name} ") for e in examples) >= 2, examples
    assert "(required) (default" not in done.stdout and "(default: )" not in done.stdout
