"""Engine telemetry and GPU sampling beside a run, in a child process so they never hold our GIL.

`replay.telemetry.TelemetryScraper` parses Prometheus text in Python (vLLM's page is large); in
the sender's process that would take the GIL from the send loop for milliseconds at a time. Here
both samplers run in one spawned process, started at the run's monotonic origin (shared by all
processes of a host) and stopped after the last response; their records go to the result file.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection as Pipe
from typing import Any

from replayproxy import clock
from replayproxy.replay.gpu_sampler import GpuSampler
from replayproxy.replay.telemetry import TelemetryScraper

STOP_TIMEOUT_S = 30.0


def _child(metrics_url: str, interval_s: float, gpu_command: str, pipe: Pipe) -> None:
    origin_ns = pipe.recv()
    scraper = TelemetryScraper(metrics_url, interval_s, clock.now_ns) if metrics_url else None
    sampler = GpuSampler(gpu_command, clock.now_ns) if gpu_command else None
    for running in (scraper, sampler):
        if running is not None:
            running.start(origin_ns)
    pipe.recv()
    records: dict[str, Any] = {}
    if scraper is not None:
        records["telemetry"] = scraper.stop()
    if sampler is not None:
        records["gpu"] = sampler.stop()
    pipe.send(records)
    pipe.close()


class Sidecars:
    """Start with `start(origin_ns)`, end with `stop()` -> {"telemetry": {...}, "gpu": {...}}."""

    def __init__(self, metrics_url: str, interval_s: float, gpu_command: str) -> None:
        self.enabled = bool(metrics_url or gpu_command)
        self._started = False
        self._records: dict[str, Any] = {}
        self._pipe: Pipe | None = None
        self._process: multiprocessing.process.BaseProcess | None = None
        if self.enabled:
            context = multiprocessing.get_context("spawn")
            self._pipe, child = context.Pipe()
            self._process = context.Process(
                target=_child,
                args=(metrics_url, interval_s, gpu_command, child),
                name="replay-sidecars",
                daemon=True,
            )
            self._process.start()
            child.close()

    def start(self, origin_ns: int) -> None:
        if self._pipe is not None and not self._started:
            self._started = True
            self._pipe.send(origin_ns)

    def stop(self) -> dict[str, Any]:
        """The samplers' records; later calls return the same records."""
        if self._pipe is None or self._process is None:
            return self._records
        try:
            self.start(clock.now_ns())  # a no-op unless the run never started
            self._pipe.send(None)
            records: dict[str, Any] = self._pipe.recv() if self._pipe.poll(STOP_TIMEOUT_S) else {}
        except (EOFError, BrokenPipeError, OSError):
            records = {}
        self._process.join(5)
        if self._process.is_alive():
            self._process.terminate()
        self._pipe = self._process = None
        self._records = records
        return records
