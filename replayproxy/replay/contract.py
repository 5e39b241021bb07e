"""The conditions of a measurement, asked of the target and the host before the clock starts.

Two runs compare like for like only when they ran the same model with the same precision and
KV-cache dtype; a report warns otherwise. What the engine publishes about its configuration is
kept as it is: vLLM's CacheConfig as the labels of the `vllm:cache_config_info` gauge on /metrics,
SGLang's server arguments on `GET /get_server_info` (a subset: the settings that change results).
GPU facts come from `nvidia-smi` on the replayer's host, when it has one. Nothing here fails a run:
what cannot be read is left out.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

CONFIG_INFO = ("vllm:cache_config_info",)
SGLANG_INFO_PATHS = ("/get_server_info", "/server_info")
SGLANG_KEYS = (
    "model_path", "dtype", "kv_cache_dtype", "quantization", "context_length", "mem_fraction_static",
    "disable_radix_cache", "tp_size", "dp_size", "chunked_prefill_size", "page_size", "max_running_requests",
)  # fmt: skip
NVIDIA_SMI_QUERY = "name,memory.total,driver_version"
NVIDIA_SMI_TIMEOUT_S = 10.0


def max_model_len(models: Any) -> int | None:
    """vLLM (and the sim) put `max_model_len` on each /v1/models card."""
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        value = data[0].get("max_model_len")
        return int(value) if isinstance(value, int) else None
    return None


def config_info(metrics_text: str) -> dict[str, str]:
    """The labels of the engine's configuration info gauge, e.g. {block_size, cache_dtype, ...}."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in CONFIG_INFO:
                return {k: v for k, v in sample.labels.items() if k not in ("engine", "model_name")}
    return {}


async def engine_config(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]
) -> dict[str, Any]:
    """What the engine says about its configuration (empty when it says nothing)."""
    try:
        async with session.get(f"{url}/metrics", headers=headers) as resp:
            if resp.status == 200:
                found = config_info(await resp.text())
                if found:
                    return {"source": "vllm:cache_config_info", **found}
    except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError):
        pass
    for path in SGLANG_INFO_PATHS:
        try:
            async with session.get(f"{url}{path}", headers=headers) as resp:
                if resp.status != 200:
                    continue
                answer = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            continue
        if isinstance(answer, dict):
            kept = {k: answer[k] for k in SGLANG_KEYS if k in answer}
            if kept:
                return {"source": path, **kept}
    return {}


def gpus() -> list[dict[str, str]]:
    """One {name, memory_total, driver} per GPU of this host, from nvidia-smi; [] without it."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return []
    try:
        done = subprocess.run(
            [command, f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    out = []
    for line in done.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3:
            out.append({"name": fields[0], "memory_total": fields[1], "driver": fields[2]})
    return out


async def collect(
    url: str, models: Any, headers: Mapping[str, str], engine_args: str, note: str
) -> dict[str, Any]:
    """The run's contract beyond the engine version and /v1/models (both already in the header)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0)) as session:
        config = await engine_config(session, url, headers)
    return {
        "max_model_len": max_model_len(models),
        "engine_config": config,
        "gpus": gpus(),
        "engine_args": engine_args,
        "note": note,
    }
