"""Engine processes: start one configuration on a free local port, wait for health, always stop it.

Each engine runs in its own process group (engines such as vLLM start helper processes), so stopping
signals the whole group: SIGTERM, then SIGKILL after the engine's `stop_timeout`. The context
manager stops it on every way out — a failed start, a failed measurement, Ctrl-C, SIGTERM, SIGHUP.
The command is the configuration's argument vector, shown as `shlex.join` would quote it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from replayproxy import children
from replayproxy.clock import now_ns
from replayproxy.tune.candidates import LOCAL_HOST, Config

HEALTH_POLL_S = 0.5
LOG_TAIL_LINES = 12


class EngineFailed(Exception):
    """A configuration that could not be started or served; the message ends with its log's last lines."""


@dataclass(frozen=True, slots=True)
class RunningEngine:
    url: str
    pid: int | None  # None for an engine given by URL
    command: str  # the full command line it was started with ("" for a URL)


@contextlib.contextmanager
def running(config: Config, log_path: Path) -> Iterator[RunningEngine]:
    """The engine of `config`, healthy, until the block ends."""
    engine = config.engine
    if not engine.launched:
        _wait_healthy(engine.url + engine.health, None, _deadline(engine.start_timeout_s))
        yield RunningEngine(engine.url, None, "")
        return
    port = free_port()
    argv = config.argv(port)
    command = shlex.join(argv)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log, contextlib.ExitStack() as stack:
        try:
            process = stack.enter_context(
                children.owned(
                    argv,
                    engine.stop_timeout_s,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **config.environment(port)},
                )
            )
        except (OSError, ValueError) as e:
            raise EngineFailed(f"cannot start {command!r}: {e}") from e
        url = f"http://{LOCAL_HOST}:{port}"
        _wait_healthy(url + engine.health, process, _deadline(engine.start_timeout_s))
        yield RunningEngine(url, process.pid, command)


class Fresh:
    """The engine of `config` for a series of replays; with `restart_between_runs` every replay after
    the first gets a newly started one (a cold cache for an engine that has no reset, e.g. a
    llama-server without --slot-save-path). Stopped on every way out, as `running` stops it."""

    def __init__(self, config: Config, log_path: Path) -> None:
        self.config, self.log_path = config, log_path
        self._stack = contextlib.ExitStack()
        self._used = False
        self.engine = RunningEngine("", None, "")

    def __enter__(self) -> Fresh:
        self.engine = self._stack.enter_context(running(self.config, self.log_path))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def for_run(self) -> RunningEngine:
        """The engine to replay on now: restarted first when asked and it served a replay before."""
        if self._used and self.config.engine.restart_between_runs:
            self._stack.close()
            self.engine = self._stack.enter_context(running(self.config, self.log_path))
        self._used = True
        return self.engine


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCAL_HOST, 0))
        port: int = s.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines an engine printed, for the record of a configuration that failed."""
    try:
        with open(path, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - 16384, 0))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _wait_healthy(url: str, process: subprocess.Popen[bytes] | None, deadline: int) -> None:
    last = "no answer"
    while True:
        if process is not None and process.poll() is not None:
            raise EngineFailed(f"exited with status {process.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
                last = f"HTTP {answer.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
        if now_ns() >= deadline:
            raise EngineFailed(f"not healthy at {url} within the start timeout (last: {last})")
        time.sleep(HEALTH_POLL_S)


def _deadline(seconds: float) -> int:
    return now_ns() + int(seconds * 1e9)
