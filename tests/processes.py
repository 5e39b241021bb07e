"""Processes as the kernel sees them (/proc), for tests that a command leaves no child behind.

Killed processes nobody reaped (an init that does not reap orphans, as in some containers) are
zombies: they no longer run and are not counted. A command under test is watched until it exits
for its peak memory (`VmHWM`): `wait4`'s `ru_maxrss` cannot serve, because Linux carries the
high-water mark across `fork` and `exec`, so a command started by a test process that once held
700 MB reports 700 MB.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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
    max_rss_mb: float  # peak resident memory of the command itself, watched every 20 ms
    stdout: str
    stderr: str


def start_cli(*argv: str, out_dir: Path) -> subprocess.Popen[bytes]:
    """`python -m replayproxy ARGV...` with stdout and stderr in files (no pipe the test must drain).
    SIGINT is reset to its default: a suite started as a background job (`pytest ... &` in a
    script) inherits it ignored, and Python then never turns it into KeyboardInterrupt."""
    with (out_dir / "stdout.txt").open("wb") as out, (out_dir / "stderr.txt").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "replayproxy", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            preexec_fn=_default_sigint,
        )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _peak_kib(pid: int) -> int:
    """The process's resident high-water mark since its `exec`, 0 once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def finish(process: subprocess.Popen[bytes], out_dir: Path) -> Finished:
    """Wait for a command started by `start_cli`: its status, peak memory and output."""
    peak_kib = 0
    while True:
        peak_kib = max(peak_kib, _peak_kib(process.pid))
        pid, status = os.waitpid(process.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.02)
    process.returncode = os.waitstatus_to_exitcode(status)
    return Finished(
        process.returncode,
        peak_kib / 1024,
        (out_dir / "stdout.txt").read_text(errors="replace"),
        (out_dir / "stderr.txt").read_text(errors="replace"),
    )
