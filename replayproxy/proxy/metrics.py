"""The proxy's Prometheus metrics: the one list of names, and a registry of the proxy's own.

Labels are closed vocabularies only (endpoint class, status class, error class, reason): no
label can carry a path, a model name, a header value or any other user data. Counters touched
per request on the event loop are plain integers read at scrape time, so forwarding pays no
locks; the recorder thread updates the rest through prometheus-client, which is thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
    ("replayproxy_trace_bytes_written_total", "counter", "Bytes written to trace files", ()),
    ("replayproxy_writer_queue_depth", "gauge", "Captured requests waiting for the recorder thread", ()),
    (
        "replayproxy_recorder_errors_total",
        "counter",
        "Recording failures (traffic unaffected), by kind",
        ("kind",),
    ),
    ("replayproxy_trace_files", "gauge", "Trace files currently kept in the trace directory", ()),
)
METRIC_NAMES = tuple(name for name, _, _, _ in METRICS)
DROP_REASONS = ("queue_full", "writer_error", "shape_error")
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
    in_flight: Callable[[], int] = lambda: 0
    upstream_connections: Callable[[], int] = lambda: 0


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
        self.ttft = Histogram(*_args("replayproxy_ttft_seconds"), buckets=TTFT_BUCKETS_S, registry=reg)
        self.tpot = Histogram(*_args("replayproxy_tpot_seconds"), buckets=TPOT_BUCKETS_S, registry=reg)
        self.e2e = Histogram(*_args("replayproxy_e2e_seconds"), buckets=E2E_BUCKETS_S, registry=reg)
        self.input_tokens = Counter(*_args("replayproxy_input_tokens_total"), registry=reg)
        self.output_tokens = Counter(*_args("replayproxy_output_tokens_total"), registry=reg)
        self.records_written = Counter(*_args("replayproxy_records_written_total"), registry=reg)
        self.records_dropped = Counter(*_args("replayproxy_records_dropped_total"), registry=reg)
        self.trace_bytes = Counter(*_args("replayproxy_trace_bytes_written_total"), registry=reg)
        self.queue_depth = Gauge(*_args("replayproxy_writer_queue_depth"), registry=reg)
        self.recorder_errors = Counter(*_args("replayproxy_recorder_errors_total"), registry=reg)
        self.trace_files = Gauge(*_args("replayproxy_trace_files"), registry=reg)
        for reason in DROP_REASONS:
            self.records_dropped.labels(reason)
        for kind in RECORDER_ERROR_KINDS:
            self.recorder_errors.labels(kind)

    def count_recorder_error(self, kind: str) -> None:
        self.recorder_errors.labels(kind).inc()


def _args(name: str) -> tuple[str, str, tuple[str, ...]]:
    _, help, labels = _SPEC[name]
    return name.removesuffix("_total"), help, labels
