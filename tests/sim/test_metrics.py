from replayproxy.sim.config import SimConfig
from replayproxy.sim.engine import Engine
from replayproxy.sim.metrics import Buckets, Metrics
from tests.sim.helpers import metric


def test_buckets_are_cumulative_on_export() -> None:
    buckets = Buckets((0.1, 1.0))
    for value in (0.05, 0.5, 0.7, 3.0):
        buckets.observe(value)
    family = buckets.family("x_seconds", "doc", "m")
    values = {s.labels.get("le"): s.value for s in family.samples if s.name == "x_seconds_bucket"}
    assert values == {"0.1": 1, "1.0": 3, "+Inf": 4}
    assert buckets.count == 4 and abs(buckets.sum - 4.25) < 1e-9


def test_render_has_vllm_names_with_model_label() -> None:
    metrics = Metrics("my-model")
    metrics.engine = Engine(SimConfig(), metrics)
    text = metrics.render().decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert metric(text, name) == 0.0
    assert 'model_name="my-model"' in text


def test_cache_config_info_carries_the_cache_settings_as_labels() -> None:
    metrics = Metrics("m")
    metrics.engine = Engine(SimConfig(block_size=32, prefix_cache=False, kv_cache_dtype="fp8"), metrics)
    line = next(x for x in metrics.render().decode().splitlines() if x.startswith("vllm:cache_config_info{"))
    assert 'block_size="32"' in line and 'cache_dtype="fp8"' in line
    assert 'enable_prefix_caching="False"' in line and line.endswith(" 1.0")
