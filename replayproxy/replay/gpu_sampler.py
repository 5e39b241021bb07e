"""Optional GPU sampler: run the user's sampling command (e.g. `nvidia-smi ... -lms 250`) beside a replay.

Its CSV lines are timestamped on arrival and stored in the result file, so GPU memory and
utilization can be read next to the latency percentiles of the same run.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
from collections.abc import Callable
from typing import Any

MAX_LINES = 200_000  # bounded: about 14 hours at 4 lines per second


class GpuSampler:
    """Runs one command for the length of the run and collects its output lines with times."""

    def __init__(self, command: str, clock_ns: Callable[[], int]) -> None:
        self.command = command
        self._clock_ns = clock_ns
        self._origin_ns = 0
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self.lines: list[tuple[int, str]] = []
        self.dropped = 0

    def start(self, origin_ns: int) -> None:
        self._origin_ns = origin_ns
        self._process = subprocess.Popen(
            shlex.split(self.command), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._reader = threading.Thread(target=self._read, name="gpu-sampler", daemon=True)
        self._reader.start()

    def stop(self) -> dict[str, Any]:
        """Stop the command and return the record stored in the result file."""
        returncode = None
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(5)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(5)
            returncode = self._process.returncode
        if self._reader is not None:
            self._reader.join(5)
        return {
            "command": self.command,
            "returncode": returncode,
            "lines": [[t, line] for t, line in self.lines],
            "dropped": self.dropped,
        }

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if len(self.lines) >= MAX_LINES:
                self.dropped += 1
                continue
            self.lines.append((self._clock_ns() - self._origin_ns, line.rstrip("\n")))
