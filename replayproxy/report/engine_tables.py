"""Report sections about the conditions and the engine: the contract, engine telemetry, GPU samples."""

from __future__ import annotations

from collections.abc import Callable

from replayproxy.report.cells import MISSING, Table, fmt, pct
from replayproxy.report.decision_types import ContractDoc
from replayproxy.report.document_types import Document, TelemetryFigures, summary_of

CONTRACT_ROWS: tuple[tuple[str, Callable[[ContractDoc], object]], ...] = (
    ("engine version", lambda c: c["engine_version"]),
    ("model", lambda c: c["model"]),
    ("max_model_len", lambda c: fmt(c["max_model_len"])),
    ("engine config from", lambda c: c["engine_config"].get("source", MISSING)),
    ("GPUs", lambda c: ", ".join(f"{g['name']} {g['memory_total']}" for g in c["gpus"]) or MISSING),
    ("GPU driver", lambda c: ", ".join(sorted({g["driver"] for g in c["gpus"]})) or MISSING),
    ("--engine-args", lambda c: c["engine_args"] or MISSING),
    ("--note", lambda c: c["note"] or MISSING),
    ("warm-up requests", lambda c: fmt(c["warmup"].get("requests")) if c["warmup"] else "none"),
    ("runs", lambda c: fmt(c["runs"])),
    ("cache reset", lambda c: c["cache_reset"]),
    ("prompt lengths", lambda c: c["prompt_lengths"]),
)


# The engine settings shown (all published ones are in the JSON): vLLM CacheConfig, SGLang server args.
CONTRACT_CONFIG = (
    "block_size", "cache_dtype", "kv_cache_dtype", "dtype", "quantization", "enable_prefix_caching",
    "disable_radix_cache", "gpu_memory_utilization", "mem_fraction_static", "num_gpu_blocks",
    "kv_cache_memory_bytes", "context_length", "tp_size", "dp_size", "page_size", "chunked_prefill_size",
    "max_running_requests",
    # llama.cpp: /props, /slots, /v1/models meta
    "model_file", "model_ftype", "total_slots", "n_ctx_per_slot", "n_ctx_train", "n_params", "metrics",
    "slots_endpoint",
    # TGI: /info
    "model_id", "model_dtype", "max_input_tokens", "max_total_tokens", "max_concurrent_requests",
    "max_batch_total_tokens",
)  # fmt: skip


def contract_section(doc: Document) -> list[Table]:
    """The conditions each candidate was measured under (first run of each), side by side."""
    cs = doc["contracts"]
    if not cs:
        return []
    rows = [[title, *(str(get(c) or MISSING) for c in cs)] for title, get in CONTRACT_ROWS]
    present = {k for c in cs for k in c["engine_config"]}
    rows += [
        [k, *(str(c["engine_config"].get(k, MISSING)) for c in cs)] for k in CONTRACT_CONFIG if k in present
    ]
    notes = [w for w in doc["warnings"] if w.startswith("not a like-for-like")]
    return [Table("Contract", ["", *(c["label"] for c in cs)], rows, notes, "contract")]


# (row title, the figure, how it is shown)
TelemetryRow = tuple[str, Callable[[TelemetryFigures], float | None], Callable[[float | None], str]]
TELEMETRY_ROWS: tuple[TelemetryRow, ...] = (
    ("KV cache usage peak", lambda t: t.get("kv_usage_peak"), pct),
    ("KV cache usage mean", lambda t: t.get("kv_usage_mean"), pct),
    ("requests waiting, peak", lambda t: t.get("waiting_peak"), fmt),
    ("time with requests waiting", lambda t: t.get("waiting_time_share"), pct),
    ("requests running, peak", lambda t: t.get("running_peak"), fmt),
    ("preemptions per 1k requests", lambda t: t.get("preemptions_per_1k_requests"), fmt),
    ("engine prefix-cache hit rate", lambda t: t.get("prefix_hit_rate"), pct),
)
ENGINE_LATENCY = (("TTFT", "ttft", "ttft_ms"), ("ITL", "itl", "itl_ms"), ("E2E", "e2e", "e2e_ms"))
ENGINE_BUCKETS = (50, 90, 99)


def telemetry_section(doc: Document) -> list[Table]:
    """Why a run was slow, in the engine's own words, beside the client's view of the same run."""
    pairs = [(r, telemetry) for r in doc["runs"] if (telemetry := r["telemetry"])]
    if not pairs:
        return []
    runs, figures = [r for r, _ in pairs], [t for _, t in pairs]
    rows = [[title, *(show(get(t.figures)) for t in figures)] for title, get, show in TELEMETRY_ROWS]
    rows.append(["trace prefix reuse", *(pct(r["trace_prefix_reuse"]) for r in runs)])
    for name, engine_key, client_key in ENGINE_LATENCY:
        engine = [t.engine_latency_ms.get(engine_key) for t in figures]
        rows.append(
            [
                f"{name} mean ms: engine / client",
                *(
                    f"{fmt(e.mean if e else None)} / {fmt(summary_of(r, client_key)['mean'])}"
                    for e, r in zip(engine, runs, strict=True)
                ),
            ]
        )
        for q in ENGINE_BUCKETS:
            rows.append(
                [
                    f"{name} p{q} ms: engine bucket",
                    *(_bucket(e.buckets.get(q) if e else None) for e in engine),
                ]
            )
    notes = [
        f"engine figures come from the target's /metrics, polled during the run; {MISSING} = not exposed",
        "engine means are exact (_sum / _count); beside the client's mean, the difference is network, "
        "proxy and client time",
        "engine percentiles are histogram buckets (the value lies within the bounds): not comparable "
        "with the client's exact percentiles",
    ]
    return [Table("Engine telemetry", ["figure", *(r["name"] for r in runs)], rows, notes, "telemetry")]


def _bucket(bounds: tuple[float, float | None] | None) -> str:
    if not bounds:
        return MISSING
    low, high = bounds
    return f"> {fmt(low)}" if high is None else f"{fmt(low)}..{fmt(high)}"


def gpu_section(doc: Document) -> list[Table]:
    """GPU memory and utilization per run, from the replayer's --gpu-sampler lines."""
    pairs = [(r, gpu) for r in doc["runs"] if (gpu := r["gpu"])]
    if not pairs:
        return []
    runs, gpus = [r for r, _ in pairs], [g for _, g in pairs]
    rows = [
        ["GPU memory used, peak MiB", *(fmt(g["memory_used_peak_mib"]) for g in gpus)],
        ["GPU utilization, mean %", *(fmt(g["utilization_mean_pct"]) for g in gpus)],
        ["GPUs", *(fmt(g["gpus"]) for g in gpus)],
        ["samples (unparsed)", *(f"{g['samples']} ({g['unparsed']})" for g in gpus)],
    ]
    notes = [
        "from --gpu-sampler, e.g. "
        "nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv -lms 250"
    ]
    return [Table("GPU", ["figure", *(r["name"] for r in runs)], rows, notes, "gpu")]
