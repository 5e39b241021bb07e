"""Start replayproxy servers (the sim, the proxy) as subprocesses and always stop them.

Used by the demo and the end-to-end tests: each server prints a `... listening on http://HOST:PORT`
line, which is how a caller learns the ephemeral port it got. Each runs in its own process group
(the proxy starts a recorder process), killed with the group once the server was asked to stop.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from replayproxy import children
from replayproxy.errors import BadOption

_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)  # every line it printed (stdout + stderr)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """`sig` to the server itself (so a proxy drains), then SIGKILL to whatever is left of its group."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)
        children.stop(self.process, 0.0)
        return self.process.returncode


@contextlib.contextmanager
def run_server(
    argv: Sequence[str],
    *,
    startup_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    niceness: int = 0,
) -> Iterator[Server]:
    """Run `python -m <argv...>` until the block ends; yields once it printed its listening line.

    `niceness` lowers the server's CPU priority, so a client on the same machine keeps its timing.
    """
    with children.owned(
        [sys.executable, "-m", *argv],
        0.0,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    ) as process:
        yield from _served(process, argv, startup_timeout_s, niceness)


def _served(
    process: subprocess.Popen[str], argv: Sequence[str], startup_timeout_s: float, niceness: int
) -> Iterator[Server]:
    if niceness:  # at once, before the new interpreter starts any thread; relative to our own
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, process.pid, os.getpriority(os.PRIO_PROCESS, 0) + niceness)
    server = Server("", process)
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            server.output.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and not server.url:
                server.url = match.group(1)
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        if not ready.wait(startup_timeout_s) or not server.url:
            tail = "\n".join(server.output[-20:])
            raise RuntimeError(f"'{' '.join(argv)}' did not start listening:\n{tail}")
        yield server
    finally:
        server.stop()
        reader.join(5)


@contextlib.contextmanager
def proxy_in_front(target_url: str, trace_dir: Path) -> Iterator[str]:
    """A proxy in front of `target_url` recording into `trace_dir`, as production's was, for one run
    (`replay --via-proxy`): the replay's timings are then taken at the same point as production's.
    Stopped (its trace written) when the run ends."""
    argv = ["replayproxy", "proxy", "--upstream", target_url, "--listen", "127.0.0.1:0"]
    argv += ["--admin-listen", "", "--trace-dir", str(trace_dir)]
    with contextlib.ExitStack() as stack:
        try:
            proxy = stack.enter_context(run_server(argv))
        except RuntimeError as e:  # its last line says why
            raise BadOption(f"--via-proxy: the proxy did not start: {str(e).splitlines()[-1]}") from e
        yield proxy.url
