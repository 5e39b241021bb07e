"""Child processes a command owns: each in its own process group, always stopped with its group.

A child in a new session does not get the terminal's Ctrl-C, and stopping only its pid would leave
what it started (an engine's workers, a replay's preparer, a scorer's `sleep &`) alive and holding
its pipes. So a child is stopped by its group, SIGTERM then SIGKILL after a grace period, on every
way out of the block that owns it; `signals_interrupt` turns SIGTERM and SIGHUP to the parent into
KeyboardInterrupt, so that block's `finally` runs whichever of them ends the parent.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from replayproxy.clock import now_ns

POLL_S = 0.05  # how often a waiting loop looks at a child's exit, its deadline and `stop`
KILLED_WITHIN_S = 2.0  # a SIGKILLed process is gone at once but for a process stuck in the kernel
_CHUNK = 65536


class ChildFailed(Exception):
    """A capped run ended early, its group killed: too slow, too much output, or asked to stop."""


@contextlib.contextmanager
def owned(argv: Sequence[str], grace_s: float, **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """`argv` running in its own process group until the block ends, then stopped with its group."""
    process: subprocess.Popen[Any] = subprocess.Popen(list(argv), start_new_session=True, **popen)
    try:
        yield process
    finally:
        try:
            stop(process, grace_s)
        finally:
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def stop(process: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM to the child's group (SIGKILL at once when `grace_s` is 0), SIGKILL to whatever is left
    after `grace_s`; returns with the child reaped. A second interrupt while waiting still kills."""
    group = process.pid  # a new session's leader: its pid is the group id
    try:
        _signal_group(group, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace_s)
        _wait_group_end(group, grace_s)
    finally:
        _signal_group(group, signal.SIGKILL)
        process.wait()
        _wait_group_end(group, KILLED_WITHIN_S)


def _wait_group_end(group: int, seconds: float) -> None:
    deadline = now_ns() + int(seconds * 1e9)
    while _group_alive(group) and now_ns() < deadline:
        time.sleep(POLL_S / 5)


def run_capped(
    argv: Sequence[str],
    stdin: bytes,
    timeout_s: float,
    max_stdout: int,
    stop_event: threading.Event | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` with `stdin` written to it; its stdout, or ChildFailed when it takes over
    `timeout_s`, prints over `max_stdout` bytes or `stop_event` is set. stderr is discarded. Once
    the child itself exited, what it left running no longer holds the answer up (it is killed)."""
    deadline = now_ns() + int(timeout_s * 1e9)
    pipe = subprocess.PIPE
    with owned(argv, 0.0, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL) as process:
        assert process.stdin is not None and process.stdout is not None
        out = _exchange(process, memoryview(stdin), deadline, max_stdout, stop_event, timeout_s)
        while process.poll() is None:  # stdout closed, the child still running
            _check(deadline, stop_event, timeout_s)
            time.sleep(POLL_S)
        return subprocess.CompletedProcess(list(argv), process.returncode, bytes(out))


def _exchange(
    process: subprocess.Popen[Any],
    pending: memoryview,
    deadline: int,
    max_stdout: int,
    stop_event: threading.Event | None,
    timeout_s: float,
) -> bytearray:
    """Write stdin and read stdout without blocking on either, until stdout ends or the child exited
    and nothing more is waiting."""
    assert process.stdin is not None and process.stdout is not None
    out = bytearray()
    with selectors.DefaultSelector() as selector:
        for stream in (process.stdin, process.stdout):
            os.set_blocking(stream.fileno(), False)
        if pending:
            selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        selector.register(process.stdout, selectors.EVENT_READ)
        exited, reading = False, True
        while reading:
            _check(deadline, stop_event, timeout_s)
            events = selector.select(0 if exited else min(POLL_S, (deadline - now_ns()) / 1e9))
            if exited and not events:
                break
            for key, _ in events:
                if key.fileobj is process.stdin:
                    pending = _write(process, selector, pending)
                    continue
                data = os.read(key.fd, _CHUNK)
                if not data:
                    selector.unregister(process.stdout)
                    reading = False
                out += data
                if len(out) > max_stdout:
                    raise ChildFailed(f"printed more than {max_stdout} bytes")
            exited = process.poll() is not None
    return out


def _write(
    process: subprocess.Popen[Any], selector: selectors.BaseSelector, pending: memoryview
) -> memoryview:
    assert process.stdin is not None
    try:
        pending = pending[os.write(process.stdin.fileno(), pending[:_CHUNK]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:  # it does not read its input: nothing more to write
        pending = pending[:0]
    if not pending:
        selector.unregister(process.stdin)
        process.stdin.close()
    return pending


def _check(deadline: int, stop_event: threading.Event | None, timeout_s: float) -> None:
    if stop_event is not None and stop_event.is_set():
        raise ChildFailed("stopped")
    if now_ns() >= deadline:
        raise ChildFailed(f"no answer in {timeout_s:g} s")


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a service manager, a closed terminal) end the block as Ctrl-C does, so
    every child's `finally` stops it. Outside the main thread signals cannot be caught: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _group_alive(group: int) -> bool:
    """Whether a member of the group still runs; killed members that nobody reaped (an init that
    does not reap orphans) are zombies and do not count."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no /proc to tell zombies apart
    for entry in entries:
        if entry.isdigit() and _running_in(entry, group):
            return True
    return False


def _running_in(pid: str, group: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
    except (OSError, IndexError):
        return False
    return fields[0] not in (b"Z", b"X") and int(fields[2]) == group  # state, ppid, pgrp
