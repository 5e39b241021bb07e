"""Engine telemetry during a replay: poll the target's Prometheus endpoint off the send path.

Latency tables say *that* a candidate is slower; the engine's own gauges and counters say *why*
(queueing, KV cache full, preemption, prefix-cache misses). Metric names differ per engine and
version, so one table maps them to canonical names; what is missing is tolerated and what was
found is recorded. Polling runs in its own thread so parsing never delays a scheduled send.
"""

from __future__ import annotations

import math
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# canonical name -> (how several label sets combine, engine metric names in order of preference).
# Sources: vLLM docs/usage/metrics.md and vllm/v1/metrics/loggers.py (v0 names kept for old
# servers), SGLang docs/references/production_metrics.md, TGI reference/metrics, llama.cpp
# tools/server/README.md "Available metrics".
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "running": ("sum", ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size",
                        "llamacpp:requests_processing")),
    "waiting": ("sum", ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size",
                        "llamacpp:requests_deferred")),
    "kv_usage": ("max", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")),
    "prefix_hit_rate": ("max", ("sglang:cache_hit_rate",)),
}  # fmt: skip
COUNTERS: dict[str, tuple[str, ...]] = {
    "preemptions": ("vllm:num_preemptions", "vllm:num_preemptions_total", "sglang:num_retracted_reqs"),
    "prefix_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "prompt_tokens": ("vllm:prompt_tokens", "sglang:prompt_tokens", "llamacpp:prompt_tokens"),
    "generation_tokens": ("vllm:generation_tokens", "sglang:generation_tokens", "llamacpp:tokens_predicted"),
    "cached_prompt_tokens": ("llamacpp:prompt_tokens_cached",),
}
# llama.cpp (build 11434) has no KV-usage gauge; its prompt counter excludes the cached tokens, so
# its prefix-cache hits are `cached` of `cached + prompt` tokens, at token granularity.
LLAMACPP_BLOCK_SIZE = 1
METRICS_OFF_HINT = {501: "llama-server serves /metrics only when started with --metrics"}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft_s": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl_s": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
              "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    "e2e_s": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds",
              "tgi_request_duration"),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts by upper bound (`le`), summed over label sets."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float

    def to_record(self) -> dict[str, Any]:
        return {"buckets": [list(b) for b in self.buckets], "count": self.count, "sum": self.total}


@dataclass(slots=True)
class Scrape:
    """One scrape, in canonical names, plus which engine names supplied them."""

    values: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    found: dict[str, str] = field(default_factory=dict)  # canonical -> engine metric name


def parse_exposition(text: str) -> Scrape:
    """Map a Prometheus text exposition to canonical names; unknown metrics are ignored.

    Samples are looked up by sample name (not family), because parsers disagree on whether a
    counter's `_total` sample belongs to the family declared without the suffix.
    """
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    snapshot = Scrape()
    for canonical, (combine, names) in GAUGES.items():
        _first_found(snapshot, canonical, names, samples, max if combine == "max" else math.fsum)
    for canonical, names in COUNTERS.items():
        _first_found(snapshot, canonical, names, samples, math.fsum, suffixes=("_total", ""))
    for canonical, names in HISTOGRAMS.items():
        for name in names:
            histogram = _histogram(samples, name)
            if histogram is not None:
                snapshot.histograms[canonical] = histogram
                snapshot.found[canonical] = name
                break
    cached = snapshot.values.get("cached_prompt_tokens")
    if cached is not None and "prefix_hits" not in snapshot.values:
        snapshot.values["prefix_hits"] = cached
        snapshot.values["prefix_queries"] = cached + snapshot.values.get("prompt_tokens", 0.0)
    return snapshot


def _first_found(
    snapshot: Scrape,
    canonical: str,
    names: tuple[str, ...],
    samples: dict[str, list[Any]],
    combine: Callable[[list[float]], float],
    suffixes: tuple[str, ...] = ("",),
) -> None:
    for name in names:
        for suffix in suffixes:
            values = [s.value for s in samples.get(name + suffix, ())]
            if values:
                snapshot.values[canonical] = combine(values)
                snapshot.found[canonical] = name
                return


def _histogram(samples: dict[str, list[Any]], name: str) -> Histogram | None:
    buckets: dict[float, float] = {}
    for sample in samples.get(f"{name}_bucket", ()):
        le = float(sample.labels["le"])
        buckets[le] = buckets.get(le, 0.0) + sample.value
    if not buckets:
        return None
    count = math.fsum(s.value for s in samples.get(f"{name}_count", ()))
    total = math.fsum(s.value for s in samples.get(f"{name}_sum", ()))
    return Histogram(tuple(sorted(buckets.items())), count, total)


class TelemetryScraper:
    """Polls one /metrics URL every `interval_s` in a daemon thread until `stop()`.

    Samples keep gauges and counters over time; histograms are kept from the first and the last
    scrape only, since their difference is the engine's own distribution for the run.
    """

    def __init__(
        self, url: str, interval_s: float, clock_ns: Callable[[], int], timeout_s: float = 2.0
    ) -> None:
        self.url = url
        self._interval_s = interval_s
        self._clock_ns = clock_ns
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._origin_ns = 0
        self.samples: list[dict[str, Any]] = []
        self.first: Scrape | None = None
        self.last: Scrape | None = None
        self.errors = 0
        self.last_error = ""

    def start(self, origin_ns: int) -> None:
        """Begin polling; sample times are stored relative to `origin_ns` (the run start)."""
        self._origin_ns = origin_ns
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop, take one final scrape, and return the record stored in the result file."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._timeout_s + self._interval_s + 1.0)
        self._scrape_once()
        found: dict[str, str] = {}
        for snapshot in (self.first, self.last):
            if snapshot is not None:
                found.update(snapshot.found)
        return {
            "source": self.url,
            "interval_s": self._interval_s,
            "found": found,
            "samples": self.samples,
            "histograms_start": _histograms_record(self.first),
            "histograms_end": _histograms_record(self.last),
            "errors": self.errors,
            "last_error": self.last_error,
        }

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._scrape_once()
            self._stop.wait(self._interval_s)

    def _scrape_once(self) -> None:
        taken_ns = self._clock_ns() - self._origin_ns
        try:
            with urllib.request.urlopen(self.url, timeout=self._timeout_s) as response:  # noqa: S310 — the user's target
                text = response.read().decode("utf-8", "replace")
            snapshot = parse_exposition(text)
        except (OSError, urllib.error.URLError, ValueError) as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"[:200]
            return
        if self.first is None:
            self.first = snapshot
        self.last = snapshot
        self.samples.append({"t_ns": taken_ns, **snapshot.values})


def _histograms_record(snapshot: Scrape | None) -> dict[str, Any]:
    return {name: h.to_record() for name, h in snapshot.histograms.items()} if snapshot else {}


def cache_state(text: str) -> dict[str, Any]:
    """The engine's KV block size (vLLM `vllm:cache_config_info{block_size=...}`) and its
    cumulative prefix-cache counters (tokens), from one exposition; keys only for what was found."""
    state: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:cache_config_info"):
                continue
            size = sample.labels.get("block_size", "")
            if size.isdigit():
                state["block_size"] = int(size)
    snapshot = parse_exposition(text)
    if "cached_prompt_tokens" in snapshot.values:
        state.setdefault("block_size", LLAMACPP_BLOCK_SIZE)
    for name in ("prefix_hits", "prefix_queries"):
        if name in snapshot.values:
            state[name] = snapshot.values[name]
    return state


def scrape_cache_state(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """`cache_state` of the metrics at `url`, or {"error": ...} when they cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 — the user's target
            return cache_state(response.read().decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def metrics_problem(url: str, timeout_s: float = 5.0) -> str:
    """Why `url` gives no metrics ("" when it does), with the fix where the engine is known."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 — the user's target
            response.read()
        return ""
    except urllib.error.HTTPError as e:
        hint = METRICS_OFF_HINT.get(e.code)
        return f"{url} answered HTTP {e.code}" + (f": {hint}" if hint else "")
    except (OSError, ValueError) as e:
        return f"{url}: {type(e).__name__}: {e}"[:200]
