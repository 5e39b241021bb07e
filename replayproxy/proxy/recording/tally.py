"""What the recorder process tells the proxy: counts since its last report, its state, its log lines.

The recorder runs in a child process (recorder.py), so the figures it adds up reach `/metrics` and
`/healthz` only through these reports. A `Tally` holds deltas (written, dropped, clamped, ...)
plus absolute state (whether writing fails and why, trace files kept); the proxy adds the deltas
to its registry (`apply`), so a restarted recorder's counts simply go on from where they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from replayproxy.proxy.metrics import Buckets, EndpointFigures, ProxyMetrics


@dataclass(slots=True)
class Tally:
    """Counts since the last report (written by the recorder's one thread), plus its present state."""

    received: int = 0  # captures taken off the pipe
    written: int = 0  # records flushed to a trace file
    trace_bytes: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # by reason (shape_error, writer_error)
    lost: dict[str, int] = field(default_factory=dict)  # written, then lost with their file
    clamped: dict[str, int] = field(default_factory=dict)  # by trace field
    errors: dict[str, int] = field(default_factory=dict)  # by kind (disk_full, permission, io, crash)
    uploads: dict[str, int] = field(default_factory=dict)  # trace files sent to object storage, by outcome
    figures: dict[str, EndpointFigures] = field(default_factory=dict)  # by endpoint class
    logs: list[tuple[int, str]] = field(default_factory=list)  # (logging level, line)
    failing: str = ""  # why records are being dropped (trace writing fails); "" while it works
    trace_files: int = -1  # files kept in the trace directory; -1: not looked at since

    def count(self, counts: dict[str, int], key: str, n: int = 1) -> None:
        counts[key] = counts.get(key, 0) + n

    def endpoint(self, name: str) -> EndpointFigures:
        found = self.figures.get(name)
        if found is None:
            found = self.figures[name] = EndpointFigures()
        return found

    @property
    def settled(self) -> int:
        """Captures this report accounts for: written or dropped (a written record later lost counts
        as written)."""
        return self.written + sum(self.dropped.values())

    def changed(self) -> bool:
        return bool(
            self.received or self.written or self.trace_bytes or self.dropped or self.lost or self.clamped
            or self.errors or self.uploads or self.figures or self.logs or self.trace_files >= 0
        )  # fmt: skip

    def take(self) -> Tally:
        """This tally as it is, leaving this one empty (its state kept) for the next report."""
        taken = Tally(
            self.received, self.written, self.trace_bytes, self.dropped, self.lost, self.clamped,
            self.errors, self.uploads, self.figures, self.logs, self.failing, self.trace_files,
        )  # fmt: skip
        self.received = self.written = self.trace_bytes = 0
        self.dropped, self.lost, self.clamped, self.errors, self.uploads = {}, {}, {}, {}, {}
        self.figures, self.logs, self.trace_files = {}, [], -1
        return taken

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "received": self.received, "written": self.written, "trace_bytes": self.trace_bytes,
            "dropped": self.dropped, "lost": self.lost, "clamped": self.clamped, "errors": self.errors,
            "uploads": self.uploads, "logs": self.logs, "failing": self.failing,
            "trace_files": self.trace_files,
        }  # fmt: skip
        record["figures"] = {
            name: [[(b.counts, b.sum) for b in _series(f)], f.input_tokens, f.output_tokens]
            for name, f in self.figures.items()
        }
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Tally:
        tally = cls(
            received=record["received"], written=record["written"], trace_bytes=record["trace_bytes"],
            dropped=record["dropped"], lost=record["lost"], clamped=record["clamped"],
            errors=record["errors"], uploads=record.get("uploads", {}), failing=record["failing"],
            trace_files=record["trace_files"],
            logs=[(level, line) for level, line in record["logs"]],
        )  # fmt: skip
        for name, (series, inputs, outputs) in record["figures"].items():
            figures = tally.endpoint(name)
            for buckets, (counts, total) in zip(_series(figures), series, strict=True):
                buckets.counts, buckets.sum = list(counts), total
            figures.input_tokens, figures.output_tokens = inputs, outputs
        return tally


def _series(figures: EndpointFigures) -> tuple[Buckets, Buckets, Buckets]:
    return figures.ttft, figures.tpot, figures.e2e


def apply(tally: Tally, metrics: ProxyMetrics) -> None:
    """Add a report's counts to the proxy's registry (the event loop calls this; scrapes read it)."""
    if tally.written:
        metrics.records_written.inc(tally.written)
    if tally.trace_bytes:
        metrics.trace_bytes.inc(tally.trace_bytes)
    for reason, n in tally.dropped.items():
        metrics.records_dropped.labels(reason).inc(n)
    for reason, n in tally.lost.items():
        metrics.records_lost.labels(reason).inc(n)
    for name, n in tally.clamped.items():
        metrics.values_clamped.labels(name).inc(n)
    for kind, n in tally.errors.items():
        metrics.recorder_errors.labels(kind).inc(n)
    for outcome, n in tally.uploads.items():
        metrics.trace_uploads.labels(outcome).inc(n)
    if tally.trace_files >= 0:
        metrics.trace_files.set(tally.trace_files)
    for name, added in tally.figures.items():
        figures = metrics.recorded.setdefault(name, EndpointFigures())
        for mine, theirs in zip(_series(figures), _series(added), strict=True):
            mine.counts = [a + b for a, b in zip(mine.counts, theirs.counts, strict=True)]
            mine.sum += theirs.sum
        figures.input_tokens += added.input_tokens
        figures.output_tokens += added.output_tokens
