"""Processes as the kernel sees them (/proc), for tests that a command leaves no child behind.

Killed processes nobody reaped (an init that does not reap orphans, as in some containers) are
zombies: they no longer run and are not counted. A command under test is run with `wait4`, which
also gives the peak memory of the command and of the children it waited for.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    pgid: int


def running() -> list[Proc]:
    """Every process that runs now (zombies left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            found.append(Proc(int(entry), int(fields[1]), int(fields[2])))
    return found


def survivors(pids: Iterable[int], groups: Iterable[int] = (), parents: Iterable[int] = ()) -> list[Proc]:
    """Running processes that are one of `pids`, in one of `groups`, or a child of one of `parents`."""
    pids, groups, parents = set(pids), set(groups) | set(pids), set(parents) | set(pids)
    return [p for p in running() if p.pid in pids or p.pgid in groups or p.ppid in parents]


def recorded_pids(path: Path) -> list[int]:
    """Pids a test's child process wrote into `path`, one a line."""
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@dataclass(frozen=True, slots=True)
class Finished:
    returncode: int
    max_rss_mb: float  # peak resident memory of the command and of the children it waited for
    stdout: str
    stderr: str


def start_cli(*argv: str, out_dir: Path) -> subprocess.Popen[bytes]:
    """`python -m replayproxy ARGV...` with stdout and stderr in files (no pipe the test must drain)."""
    with (out_dir / "stdout.txt").open("wb") as out, (out_dir / "stderr.txt").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "replayproxy", *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=err
        )


def finish(process: subprocess.Popen[bytes], out_dir: Path) -> Finished:
    """Wait for a command started by `start_cli`: its status, peak memory and output."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return Finished(
        process.returncode,
        usage.ru_maxrss / 1024,  # KiB on Linux
        (out_dir / "stdout.txt").read_text(errors="replace"),
        (out_dir / "stderr.txt").read_text(errors="replace"),
    )
