"""Prometheus `/metrics` with vLLM's metric names, so dashboards and scrapers built for vLLM work.

Values are read from the engine at scrape time; latency histograms are kept here in plain bucket
arrays (a per-token `prometheus_client.Histogram.observe` would cost more than the token itself).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from replayproxy.sim.engine import Engine, Seq

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's bucket boundaries (vllm/engine/metrics.py, vllm/v1/metrics/loggers.py), seconds.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Buckets:
    """A cumulative-at-export histogram: counts per bucket, sum and count."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def family(self, name: str, doc: str, model: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=["model_name"])
        cumulative, buckets = 0, []
        for bound, n in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        family.add_metric([model], buckets, self.sum)
        return family


class Metrics(Collector):
    """Observes the engine (as its EngineObserver) and renders the Prometheus text format."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.engine: Engine | None = None
        self.ttft = Buckets(TTFT_BUCKETS)
        self.itl = Buckets(ITL_BUCKETS)
        self.e2e = Buckets(E2E_BUCKETS)
        self.tokenize_calls = 0  # POST /tokenize answered: a replayer's calls beside the traffic it sends
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)

    def emitted(self, seq: Seq) -> None:
        if seq.generated == 1:
            self.ttft.observe((seq.first_token_ns - seq.arrival_ns) / 1e9)
        else:
            self.itl.observe((seq.last_token_ns - seq.prev_token_ns) / 1e9)

    def finished(self, seq: Seq) -> None:
        self.e2e.observe((seq.last_token_ns - seq.arrival_ns) / 1e9)

    def render(self) -> bytes:
        return generate_latest(self._registry)

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        if engine is None:
            return
        labels = [self.model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        def counter(name: str, doc: str, value: int) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric(labels, value)
            return family

        stats = engine.stats
        config = engine.config
        # vLLM publishes its CacheConfig as the labels of an info gauge of value 1 (strings, as vLLM does).
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[
                "block_size",
                "num_gpu_blocks",
                "enable_prefix_caching",
                "engine",
                "cache_dtype",
                "gpu_memory_utilization",
            ],
        )
        info.add_metric(
            [
                str(config.block_size),
                str(config.num_gpu_blocks),
                str(config.prefix_cache),
                "0",
                config.kv_cache_dtype,
                "0.9",
            ],
            1,
        )
        yield info
        yield gauge("vllm:num_requests_running", "Requests in the running batch.", len(engine.running))
        yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", len(engine.waiting))
        usage = engine.pool.usage
        yield gauge("vllm:gpu_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", usage)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", usage)
        yield counter("vllm:num_preemptions", "Cumulative preemptions.", stats.preemptions)
        yield counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_queries
        )
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_hits)
        yield counter("vllm:prompt_tokens", "Prefilled prompt tokens of requests.", stats.prompt_tokens)
        yield counter("vllm:generation_tokens", "Generated tokens.", stats.generation_tokens)
        yield self.ttft.family("vllm:time_to_first_token_seconds", "Time to first token.", self.model)
        itl_doc = "Time between consecutive output tokens of a request."
        yield self.itl.family("vllm:time_per_output_token_seconds", itl_doc, self.model)
        yield self.itl.family("vllm:inter_token_latency_seconds", itl_doc, self.model)
        yield self.e2e.family("vllm:e2e_request_latency_seconds", "End-to-end request latency.", self.model)
        # vLLM's API server counts requests per route; the sim counts /tokenize's
        labels = ["handler", "method", "status"]
        http = CounterMetricFamily("http_requests", "Requests by handler.", labels=labels)
        http.add_metric(["/tokenize", "POST", "2xx"], self.tokenize_calls)
        yield http
