"""One load step of a sweep or a tune search: a `python -m replayproxy replay ... -o STEP.rpr`
subprocess (report must not import replay: feature packages meet only through result files), in
its own process group, its progress lines passed through and its failure told in one line.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from replayproxy import children
from replayproxy.errors import RunAborted

REPLAY_GRACE_S = 30.0  # an interrupted replay step's time to write its partial result before SIGKILL


def step_path(directory: Path, speed: float, kind: str = "speed") -> Path:
    return directory / f"{kind}-{speed:g}.rpr"


def replay_command(args: argparse.Namespace, speed: float, path: Path, *extra: str) -> list[str]:
    quiet = args.quiet or args.progress == "none"
    return [
        sys.executable,
        "-m",
        "replayproxy",
        "replay",
        *args.trace,
        "--target",
        args.target,
        "--speed",
        f"{speed:g}",
        "-o",
        str(path),
        *(["--quiet"] if quiet else ["--progress", "log"]),
        *extra,
        *args.replay_args,
    ]


def run_replay(command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Run one replay step; a failed step stops the sweep with the replayer's last words.

    Exit status 1 with the result written is a run with too many errors: a sweep step like any other.
    The step runs in its own process group (with its preparer and workers); when the caller is
    interrupted the group gets SIGTERM, which a replay ends like Ctrl-C, writing what it has.
    `env` (config.api_key_environment) carries an --api-key given to the caller.
    """
    last = ""
    with children.owned(
        command, REPLAY_GRACE_S, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    ) as step:
        assert step.stderr is not None
        for line in step.stderr:  # its progress lines pass through as they come
            if line.startswith("replay: ") and "elapsed, ETA" in line:
                sys.stderr.write(f"sweep: {line}")
                sys.stderr.flush()
            elif line.strip():
                last = line.strip()
        step.wait()
    code = step.returncode
    written = "-o" in command and Path(command[list(command).index("-o") + 1]).exists()
    if code != 0 and not (code == 1 and written):
        raise RunAborted(f"replay step failed: {last or f'exit status {code}'}")
