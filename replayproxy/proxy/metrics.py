"""The proxy's Prometheus metrics: the one list of names, and a registry of the proxy's own.

Labels are closed vocabularies only (endpoint class, status class, error class, reason): no
label can carry a path, a model name, a header value or any other user data. Figures updated
per request are plain numbers, written on the event loop and read at scrape time: counters of
forwarding (no locks) and the production latencies and token counts of recorded requests, which
the recorder process adds up and reports in batches (a prometheus-client `observe` takes a lock and
several calls per value: the five updates per request measured 28k instructions, against ~3k for
these). The rare rest goes through prometheus-client.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# Every metric the proxy exposes: name as it appears in /metrics (counters with _total), type, help,
# labels. Dashboards and alerts must use only these (tests check tools/grafana against this table).
METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "replayproxy_requests_total",
        "counter",
        "Requests answered, by endpoint and status class",
        ("endpoint", "status_class"),
    ),
    ("replayproxy_requests_in_flight", "gauge", "Requests being forwarded now", ()),
    ("replayproxy_client_cancels_total", "counter", "Requests whose client disconnected before the end", ()),
    ("replayproxy_upstream_errors_total", "counter", "Upstream failures, by error class", ("error",)),
    ("replayproxy_upstream_connections", "gauge", "Upstream connections open or opening", ()),
    ("replayproxy_client_connections", "gauge", "Client connections open", ()),
    (
        "replayproxy_client_connections_refused_total",
        "counter",
        "Client connections refused at accept, by reason (limit, fd_exhausted)",
        ("reason",),
    ),
    (
        "replayproxy_ttft_seconds",
        "histogram",
        "Production time to first content chunk (recorded requests)",
        ("endpoint",),
    ),
    (
        "replayproxy_tpot_seconds",
        "histogram",
        "Production time per output token after the first (recorded requests)",
        ("endpoint",),
    ),
    (
        "replayproxy_e2e_seconds",
        "histogram",
        "Production request latency to the end of the body (recorded requests)",
        ("endpoint",),
    ),
    (
        "replayproxy_input_tokens_total",
        "counter",
        "Prompt tokens reported by the upstream (recorded requests)",
        ("endpoint",),
    ),
    (
        "replayproxy_output_tokens_total",
        "counter",
        "Generated tokens reported or counted (recorded requests)",
        ("endpoint",),
    ),
    ("replayproxy_records_written_total", "counter", "Request shapes written to trace files", ()),
    ("replayproxy_records_dropped_total", "counter", "Request shapes not written, by reason", ("reason",)),
    (
        "replayproxy_records_lost_total",
        "counter",
        "Request shapes written, then lost with their file (e.g. the trace directory deleted), by reason",
        ("reason",),
    ),
    (
        "replayproxy_values_clamped_total",
        "counter",
        "Recorded values that did not fit their trace column: clamped, or stored as unknown; by field",
        ("field",),
    ),
    ("replayproxy_trace_bytes_written_total", "counter", "Bytes written to trace files", ()),
    (
        "replayproxy_writer_queue_depth",
        "gauge",
        "Captured requests waiting for the recorder process (queued, or in its pipe)",
        (),
    ),
    (
        "replayproxy_recorder_errors_total",
        "counter",
        "Recording failures (traffic unaffected), by kind",
        ("kind",),
    ),
    ("replayproxy_trace_files", "gauge", "Trace files currently kept in the trace directory", ()),
    (
        "replayproxy_trace_uploads_total",
        "counter",
        "Rotated trace files to object storage: uploaded, failed (attempts; retried), lost (removed first)",
        ("outcome",),
    ),
    (
        "replayproxy_recording_failing",
        "gauge",
        "1 while recording does not keep up: records dropped in the last 10 s (any reason), the recorder "
        "process stuck or down, or trace writing failing (see /healthz), else 0",
        (),
    ),
)
METRIC_NAMES = tuple(name for name, _, _, _ in METRICS)
REFUSE_REASONS = ("limit", "fd_exhausted")
UPLOAD_OUTCOMES = ("uploaded", "failed", "lost")
DROP_REASONS = ("queue_full", "writer_error", "shape_error", "recorder_exited")
RECORDER_ERROR_KINDS = ("disk_full", "permission", "io", "crash", "observer")

# Buckets for LLM serving: TTFT spans 10 ms (cached, idle) to a minute (queued long prompts);
# TPOT 5 ms (small models) to 1 s (overloaded); E2E up to 10 minutes of generation.
TTFT_BUCKETS_S = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    30.0,
    60.0,
)
TPOT_BUCKETS_S = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

_SPEC = {name: (kind, help, labels) for name, kind, help, labels in METRICS}


@dataclass(slots=True)
class HotCounters:
    """Incremented on the event loop thread only; exported at scrape time."""

    requests: dict[tuple[str, ...], int] = field(default_factory=dict)  # (endpoint, status class)
    upstream_errors: dict[str, int] = field(default_factory=dict)
    client_cancels: int = 0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSE_REASONS, 0))
    in_flight: Callable[[], int] = lambda: 0
    upstream_connections: Callable[[], int] = lambda: 0
    client_connections: Callable[[], int] = lambda: 0


class _HotCollector(Collector):
    def __init__(self, hot: HotCounters) -> None:
        self._hot = hot

    def collect(self) -> Iterator[Metric]:
        hot = self._hot
        yield _counter("replayproxy_requests_total", hot.requests.copy())
        yield _gauge("replayproxy_requests_in_flight", hot.in_flight())
        cancels = CounterMetricFamily(
            "replayproxy_client_cancels", _SPEC["replayproxy_client_cancels_total"][1]
        )
        cancels.add_metric([], hot.client_cancels)
        yield cancels
        yield _counter("replayproxy_upstream_errors_total", {(k,): v for k, v in hot.upstream_errors.items()})
        yield _gauge("replayproxy_upstream_connections", hot.upstream_connections())
        yield _gauge("replayproxy_client_connections", hot.client_connections())
        yield _counter(
            "replayproxy_client_connections_refused_total", {(k,): v for k, v in hot.refused.items()}
        )


class Buckets:
    """One histogram series: counts per bucket (`le` is inclusive), and the sum of the values."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        running = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*map(floatToGoString, self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            buckets.append((bound, running))
        return buckets


@dataclass(slots=True)
class EndpointFigures:
    """What the recorder adds up for one endpoint class."""

    ttft: Buckets = field(default_factory=lambda: Buckets(TTFT_BUCKETS_S))
    tpot: Buckets = field(default_factory=lambda: Buckets(TPOT_BUCKETS_S))
    e2e: Buckets = field(default_factory=lambda: Buckets(E2E_BUCKETS_S))
    input_tokens: int = 0
    output_tokens: int = 0


class _RecordedCollector(Collector):
    def __init__(self, figures: dict[str, EndpointFigures]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        endpoints = sorted(self._figures.items())
        for name, attr in (
            ("replayproxy_ttft_seconds", "ttft"),
            ("replayproxy_tpot_seconds", "tpot"),
            ("replayproxy_e2e_seconds", "e2e"),
        ):
            family = HistogramMetricFamily(name, _SPEC[name][1], labels=["endpoint"])
            for endpoint, figures in endpoints:
                buckets: Buckets = getattr(figures, attr)
                family.add_metric([endpoint], buckets.cumulative(), buckets.sum)
            yield family
        for name, attr in (
            ("replayproxy_input_tokens_total", "input_tokens"),
            ("replayproxy_output_tokens_total", "output_tokens"),
        ):
            yield _counter(name, {(endpoint,): getattr(figures, attr) for endpoint, figures in endpoints})


def _counter(name: str, values: Mapping[tuple[str, ...], int]) -> CounterMetricFamily:
    _, help, labels = _SPEC[name]
    family = CounterMetricFamily(name.removesuffix("_total"), help, labels=list(labels))
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _SPEC[name][1], value=value)


class ProxyMetrics:
    """The registry served on the admin listener; not the process-global default registry."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide in prometheus-client; `*_created` series only add noise here
        self.registry = CollectorRegistry(auto_describe=True)
        self.hot = HotCounters()
        self.registry.register(_HotCollector(self.hot))
        reg = self.registry
        self.recorded: dict[str, EndpointFigures] = {}  # by endpoint class, as the recorder process reports
        reg.register(_RecordedCollector(self.recorded))
        self.records_written = Counter(*_args("replayproxy_records_written_total"), registry=reg)
        self.records_dropped = Counter(*_args("replayproxy_records_dropped_total"), registry=reg)
        self.records_lost = Counter(*_args("replayproxy_records_lost_total"), registry=reg)
        self.records_lost.labels("file_deleted")
        self.values_clamped = Counter(*_args("replayproxy_values_clamped_total"), registry=reg)
        self.trace_bytes = Counter(*_args("replayproxy_trace_bytes_written_total"), registry=reg)
        self.queue_depth = Gauge(*_args("replayproxy_writer_queue_depth"), registry=reg)
        self.recorder_errors = Counter(*_args("replayproxy_recorder_errors_total"), registry=reg)
        self.trace_files = Gauge(*_args("replayproxy_trace_files"), registry=reg)
        self.recording_failing = Gauge(*_args("replayproxy_recording_failing"), registry=reg)
        self.trace_uploads = Counter(*_args("replayproxy_trace_uploads_total"), registry=reg)
        for outcome in UPLOAD_OUTCOMES:
            self.trace_uploads.labels(outcome)
        for reason in DROP_REASONS:
            self.records_dropped.labels(reason)
        for kind in RECORDER_ERROR_KINDS:
            self.recorder_errors.labels(kind)

    def count_recorder_error(self, kind: str) -> None:
        self.recorder_errors.labels(kind).inc()


def _args(name: str) -> tuple[str, str, tuple[str, ...]]:
    _, help, labels = _SPEC[name]
    return name.removesuffix("_total"), help, labels
