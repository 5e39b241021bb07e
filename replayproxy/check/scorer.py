"""The user's own scorer (`--score CMD`): one process per answer, JSON in on stdin, a number out.

stdin is `{"id", "prompt", "output", "reference"}` (`prompt`: the request's messages or prompt
text); stdout must be one finite number. The command is split like a shell would (no shell runs).
A failure costs only that answer's score: it is counted, and the first message is shown.
"""

from __future__ import annotations

import asyncio
import math
import shlex
from typing import Any

import orjson

from replayproxy.check.prompts import Prompt
from replayproxy.errors import BadOption


class ScorerError(Exception):
    """The scorer failed on one answer; the message says how (exit status, unreadable output)."""


def split_command(command: str) -> list[str]:
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise BadOption(f"--score: cannot split {command!r} ({e})") from e
    if not argv:
        raise BadOption("--score: empty command")
    return argv


async def score(argv: list[str], prompt: Prompt, output: str, timeout_s: float) -> str:
    """The scorer's number for one answer, as it printed it (validated as a finite float)."""
    payload: dict[str, Any] = {
        "id": prompt.id,
        "prompt": prompt.body.get("messages", prompt.body.get("prompt")),
        "output": output,
        "reference": prompt.reference,
    }
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        raise ScorerError(f"cannot start {argv[0]}: {e.strerror or e}") from e
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await process.communicate(orjson.dumps(payload))
    except TimeoutError:
        process.kill()
        await process.wait()
        raise ScorerError(f"no answer in {timeout_s:g} s") from None
    if process.returncode:
        detail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise ScorerError(f"exit status {process.returncode} {detail[0][:120]}".strip())
    text = out.decode(errors="replace").strip()
    try:
        value = float(text)
    except ValueError:
        raise ScorerError(f"printed {text[:40]!r}, not a number") from None
    if not math.isfinite(value):
        raise ScorerError(f"printed {text!r}, not a finite number")
    return text
