"""The conditions of a measurement, asked of the target and the host before the clock starts.

Two runs compare like for like only when they ran the same model with the same precision and
KV-cache dtype; a report warns otherwise. What the engine publishes about its configuration is
kept as it is: vLLM's CacheConfig as the labels of the `vllm:cache_config_info` gauge on /metrics,
SGLang's server arguments on `GET /get_server_info` (a subset: the settings that change results),
llama.cpp's `/props`, `/slots` and `/v1/models` meta, TGI's `/info`.
GPU facts come from `nvidia-smi` on the replayer's host, when it has one. Nothing here fails a run:
what cannot be read is left out.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from pathlib import PurePath
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from replayproxy.replay import probe_http
from replayproxy.results import GpuFacts, RunContract

CONFIG_INFO = ("vllm:cache_config_info",)
SGLANG_INFO_PATHS = ("/get_server_info", "/server_info")
SGLANG_KEYS = (
    "model_path", "dtype", "kv_cache_dtype", "quantization", "context_length", "mem_fraction_static",
    "disable_radix_cache", "tp_size", "dp_size", "chunked_prefill_size", "page_size", "max_running_requests",
)  # fmt: skip
TGI_KEYS = (
    "model_id", "model_dtype", "model_device_type", "max_concurrent_requests", "max_input_tokens",
    "max_total_tokens", "max_batch_total_tokens", "max_batch_prefill_tokens", "version",
)  # fmt: skip
LLAMACPP_META = ("n_ctx_train", "n_params", "n_vocab", "ftype")
LLAMACPP_METRICS_OFF = "off (start llama-server with --metrics)"
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


async def _get(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> tuple[int, bytes]:
    try:
        return await probe_http.request(session, "GET", url, headers)
    except (aiohttp.ClientError, TimeoutError):
        return 0, b""


async def _get_json(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> Any:
    status, raw = await _get(session, url, headers)
    if status != 200:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


async def _vllm(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> dict[str, Any]:
    status, raw = await _get(session, f"{url}/metrics", headers)
    if status != 200:
        return {}
    try:
        found = config_info(raw.decode("utf-8", "replace"))
    except ValueError:
        return {}
    return {"source": "vllm:cache_config_info", **found} if found else {}


async def _sglang(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> dict[str, Any]:
    for path in SGLANG_INFO_PATHS:
        answer = await _get_json(session, f"{url}{path}", headers)
        if isinstance(answer, dict):
            kept = {k: answer[k] for k in SGLANG_KEYS if k in answer}
            if kept:
                return {"source": path, **kept}
    return {}


async def _llamacpp(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """llama-server's /props (model file, weight type, slots), /slots (context per slot) and whether
    /metrics answers (it needs --metrics; else 501)."""
    props = await _get_json(session, f"{url}/props", headers)
    if not isinstance(props, dict) or "total_slots" not in props:
        return {}
    found: dict[str, Any] = {"source": "/props"}
    if isinstance(props.get("model_path"), str):
        found["model_file"] = PurePath(props["model_path"]).name  # the file, not the server's layout
    for key in ("model_ftype", "total_slots"):
        if key in props:
            found[key] = props[key]
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict) and isinstance(settings.get("n_ctx"), int):
        found["n_ctx_per_slot"] = settings["n_ctx"]
    slots = await _get_json(session, f"{url}/slots", headers)
    if isinstance(slots, list):
        contexts = sorted(
            {s["n_ctx"] for s in slots if isinstance(s, dict) and isinstance(s.get("n_ctx"), int)}
        )
        if contexts:
            found["n_ctx_per_slot"] = contexts[0] if len(contexts) == 1 else contexts
    else:
        found["slots_endpoint"] = "off (start llama-server with --slots)"
    status, _ = await _get(session, f"{url}/metrics", headers)
    found["metrics"] = "on" if status == 200 else LLAMACPP_METRICS_OFF
    return found


async def _tgi(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> dict[str, Any]:
    answer = await _get_json(session, f"{url}/info", headers)
    if not isinstance(answer, dict) or "model_id" not in answer:
        return {}
    return {"source": "/info", **{k: answer[k] for k in TGI_KEYS if k in answer}}


def _models_meta(models: Any) -> dict[str, Any]:
    """llama.cpp's `meta` on its /v1/models card: training context, parameters, vocabulary, weight type."""
    data = models.get("data") if isinstance(models, dict) else None
    card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    meta = card.get("meta")
    return {k: meta[k] for k in LLAMACPP_META if k in meta} if isinstance(meta, dict) else {}


Reader = Callable[[aiohttp.ClientSession, str, Mapping[str, str]], Awaitable[dict[str, Any]]]
READERS: tuple[Reader, ...] = (_vllm, _sglang, _llamacpp, _tgi)


async def engine_config(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], models: Any = None
) -> dict[str, Any]:
    """What the engine says about its configuration (empty when it says nothing), from the first of
    the engines' documented endpoints that answers."""
    for reader in READERS:
        found = await reader(session, url, headers)
        if found:
            if found["source"] == "/props":
                found.update({k: v for k, v in _models_meta(models).items() if k not in found})
            return found
    return {}


def gpus() -> list[GpuFacts]:
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
            out.append(GpuFacts(name=fields[0], memory_total=fields[1], driver=fields[2]))
    return out


async def collect(
    url: str, models: Any, headers: Mapping[str, str], engine_args: str, note: str
) -> RunContract:
    """The run's contract beyond the engine version and /v1/models (both already in the header)."""
    async with probe_http.session(30.0) as session:
        config = await engine_config(session, url, headers, models)
    return RunContract(
        max_model_len=context_length(models, config),
        engine_config=config,
        gpus=gpus(),
        engine_args=engine_args,
        note=note,
    )


def context_length(models: Any, config: dict[str, Any]) -> int | None:
    """The context the engine serves: vLLM's `max_model_len`, else llama.cpp's context per slot,
    else TGI's `max_total_tokens`; None when none is a positive number (llama.cpp slots of
    different sizes give no one length)."""
    for value in (max_model_len(models), config.get("n_ctx_per_slot"), config.get("max_total_tokens")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
