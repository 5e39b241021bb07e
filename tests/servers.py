"""Real servers on 127.0.0.1 for end-to-end tests, started as subprocesses and always stopped.

`run_server` starts any replayproxy subcommand that prints a `... listening on http://HOST:PORT`
line (the sim, the proxy), waits for that line and yields the base URL.
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

_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)  # every line it printed (stdout + stderr)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode


@contextlib.contextmanager
def run_server(argv: Sequence[str], *, startup_timeout: float = 30.0, env: dict[str, str] | None = None) -> Iterator[Server]:
    """Run `python -m <argv...>` (e.g. ["replayproxy.sim", "--port", "0"]) until the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    output: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and not url:
                url.append(match.group(1))
                found.set()
        found.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    server = Server("", process, output)
    try:
        if not found.wait(startup_timeout) or not url:
            raise RuntimeError(f"{' '.join(argv)} did not start:\n" + "\n".join(output[-30:]))
        server.url = url[0]
        yield server
    finally:
        server.stop()
        reader.join(5)


def sim(*options: str) -> contextlib.AbstractContextManager[Server]:
    """The simulated engine on an ephemeral loopback port."""
    return run_server(["replayproxy.sim", "--host", "127.0.0.1", "--port", "0", *options])
