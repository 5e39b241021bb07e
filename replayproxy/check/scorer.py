"""The user's own scorer (`--score CMD`): one process per answer, JSON in on stdin, a number out.

stdin is `{"id", "prompt", "output", "reference"}` (`prompt`: the request's messages or prompt
text); stdout must be one finite number. The command is split like a shell would (no shell runs).
Each scorer runs in its own process group, killed with everything it started when it answered, when
it overruns the per-answer timeout or prints too much, and when the check is interrupted. A failure
costs only that answer's score: it is counted, and the first message is shown, without the
scorer's output or stderr (either may quote the answer).
"""

from __future__ import annotations

import asyncio
import math
import shlex
import threading
from typing import Any

import orjson

from replayproxy import children
from replayproxy.check.prompts import Prompt
from replayproxy.errors import BadOption

MAX_PRINTED = 4096  # bytes of stdout read; a number needs a few dozen


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
    stop = (
        threading.Event()
    )  # set when this answer's task ends, cancelled included: its thread kills the group
    try:
        done = await asyncio.to_thread(
            children.run_capped, argv, orjson.dumps(payload), timeout_s, MAX_PRINTED, stop
        )
    except OSError as e:
        raise ScorerError(f"cannot start {argv[0]}: {e.strerror or e}") from e
    except children.ChildFailed as e:
        raise ScorerError(str(e)) from None
    finally:
        stop.set()
    if done.returncode:
        raise ScorerError(f"exit status {done.returncode}")
    text = done.stdout.decode(errors="replace").strip()
    try:
        value = float(text)
    except ValueError:
        raise ScorerError(f"printed {len(done.stdout)} bytes that are not one number") from None
    if not math.isfinite(value):
        raise ScorerError(f"printed {text[:12]!r}, not a finite number")
    return text
