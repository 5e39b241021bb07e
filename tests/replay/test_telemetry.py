"""Engine telemetry: metric names of each engine map to canonical ones; a live sim is scraped."""

from __future__ import annotations

import json
import urllib.request

from replayproxy import clock
from replayproxy.replay import telemetry
from replayproxy.replay.telemetry import TelemetryScraper, parse_exposition
from tests.servers import sim

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 7.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 250.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 9.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_count{model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 3.5
"""

SGLANG_TEXT = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="a"} 4.0
sglang:num_running_reqs{model_name="b"} 1.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="a"} 0.25
sglang:token_usage{model_name="b"} 0.75
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="a"} 0.4
"""

LLAMACPP_TEXT = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""


def test_vllm_names_map_to_canonical_values_and_histograms() -> None:
    snapshot = parse_exposition(VLLM_TEXT)
    assert snapshot.values == {
        "running": 3.0,
        "waiting": 2.0,
        "kv_usage": 0.5,
        "preemptions": 7.0,
        "prefix_queries": 1000.0,
        "prefix_hits": 250.0,
    }
    ttft = snapshot.histograms["ttft_s"]
    assert ttft.buckets == ((0.1, 4.0), (1.0, 9.0), (float("inf"), 10.0))
    assert (ttft.count, ttft.total) == (10.0, 3.5)
    assert snapshot.found["kv_usage"] == "vllm:kv_cache_usage_perc"


def test_sglang_sums_counts_over_models_and_takes_the_largest_usage() -> None:
    snapshot = parse_exposition(SGLANG_TEXT)
    assert snapshot.values == {"running": 5.0, "kv_usage": 0.75, "prefix_hit_rate": 0.4}
    assert snapshot.found["running"] == "sglang:num_running_reqs"


def test_llamacpp_and_missing_metrics_are_tolerated() -> None:
    snapshot = parse_exposition(LLAMACPP_TEXT)
    assert snapshot.values == {"prompt_tokens": 120.0, "waiting": 5.0}
    assert parse_exposition("").values == {}


def test_scraping_a_live_sim_records_samples_and_histograms() -> None:
    with sim("--speed", "20") as server:
        scraper = TelemetryScraper(f"{server.url}/metrics", interval_s=0.05, clock_ns=clock.now_ns)
        scraper.start(clock.now_ns())
        body = json.dumps(
            {"model": "sim-llama-3.1-8b", "prompt": "hello world " * 20, "max_tokens": 8}
        ).encode()
        for _ in range(3):
            request = urllib.request.Request(
                f"{server.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
        record = scraper.stop()
    assert record["errors"] == 0
    assert len(record["samples"]) >= 2
    assert {"running", "waiting", "kv_usage", "prompt_tokens"} <= set(record["samples"][-1])
    assert record["samples"][-1]["prompt_tokens"] >= 3 * 20
    end = record["histograms_end"]["ttft_s"]
    assert end["count"] >= 3
    times = [s["t_ns"] for s in record["samples"]]
    assert times == sorted(times) and times[0] >= 0


def test_an_unreachable_endpoint_is_counted_not_raised() -> None:
    scraper = TelemetryScraper(
        "http://127.0.0.1:9/metrics", interval_s=0.05, clock_ns=clock.now_ns, timeout_s=0.5
    )
    scraper.start(clock.now_ns())
    record = scraper.stop()
    assert record["errors"] >= 1 and record["samples"] == []
    assert record["last_error"]


def test_llamacpp_cached_prompt_tokens_become_prefix_hits_at_token_granularity() -> None:
    """build 11434: `prompt_tokens_total` excludes the cached tokens; there is no KV-usage gauge."""
    text = (
        "llamacpp:prompt_tokens_total 300\n"
        "llamacpp:prompt_tokens_cached_total 700\n"
        "llamacpp:requests_processing 2\n"
    )
    snapshot = telemetry.parse_exposition(text)
    assert snapshot.values["prefix_hits"] == 700 and snapshot.values["prefix_queries"] == 1000
    assert "kv_usage" not in snapshot.values and snapshot.values["running"] == 2
    assert telemetry.cache_state(text) == {"block_size": 1, "prefix_hits": 700, "prefix_queries": 1000}
