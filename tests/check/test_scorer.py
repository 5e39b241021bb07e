"""The user scorer: JSON on stdin, one number out; every way it can fail is one clear ScorerError."""

from __future__ import annotations

import asyncio
import sys

import pytest

from replayproxy.check.prompts import Prompt
from replayproxy.check.scorer import ScorerError, score, split_command

PROMPT = Prompt(0, "q1", "chat", {"messages": [{"role": "user", "content": "hi"}]}, reference="hello")


def run(code: str, timeout_s: float = 10.0) -> str:
    return asyncio.run(score([sys.executable, "-c", code], PROMPT, "hello there", timeout_s))


def test_scorer_reads_the_payload() -> None:
    code = (
        "import json, sys; d = json.load(sys.stdin); "
        "print(float(d['output'].startswith(d['reference'])) + len(d['prompt']) + (d['id'] == 'q1'))"
    )
    assert run(code) == "3.0"


@pytest.mark.parametrize(
    ("code", "timeout_s", "message"),
    [
        ("print('good')", 60, "printed 5 bytes that are not one number"),
        ("print('nan')", 60, "not a finite number"),
        ("import sys; sys.exit('broken scorer')", 60, "exit status 1$"),
        ("import time; time.sleep(60)", 1, "no answer in 1 s"),
        ("import sys; sys.stdout.write('1' * 5000)", 60, "printed more than 4096 bytes"),
    ],
)
def test_scorer_failures(code: str, timeout_s: float, message: str) -> None:
    with pytest.raises(ScorerError, match=message):
        run(code, timeout_s)


def test_scorer_messages_never_quote_its_output_or_stderr() -> None:
    """The scorer may echo the answer (its stdin) anywhere; none of it reaches the message."""
    for code in (
        "import sys; print(sys.stdin.read())",
        "import sys; sys.exit(sys.stdin.read())",
    ):
        with pytest.raises(ScorerError) as failed:
            run(code)
        assert "hello" not in str(failed.value) and "hi" not in str(failed.value).split()


def test_missing_scorer_and_bad_command() -> None:
    with pytest.raises(ScorerError, match="cannot start /nonexistent/scorer"):
        asyncio.run(score(["/nonexistent/scorer"], PROMPT, "x", 5))
    with pytest.raises(ValueError, match="--score: cannot split"):
        split_command("python 'unclosed")
    assert split_command("python score.py --k 'a b'") == ["python", "score.py", "--k", "a b"]
