"""Where the target's own tokenizer lies on this host, found from what the engine says it serves.

A replay that counts tokens with the engine's tokenize endpoint during the run adds calls to the
engine production never sent, so a local copy of the served tokenizer is looked for first, in the
places the engine names: vLLM's `root` on each `/v1/models` card (the model path it was started
with), SGLang's `tokenizer_path` / `model_path` on `/get_server_info`, llama.cpp's `model_path` on
`/props` (a GGUF file: offered only where the `gguf` package can read it), then each of those names
and the served ids in the Hugging Face cache. Nothing is downloaded; the answer is a path, and
loading it is the tokenizer's business (replay.hf_tokenizer).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from replayproxy.replay.models import served_models
from replayproxy.replay.target import get_json

INFO_PATHS = ("/get_server_info", "/props")  # SGLang, llama.cpp: GET, JSON naming the model's files
PATH_KEYS = ("tokenizer_path", "model_path")


class Found(NamedTuple):
    path: str  # a directory holding tokenizer.json, or a .gguf file
    source: str  # which answer named it, e.g. "/v1/models root"


def hub_cache() -> Path:
    """The Hugging Face hub cache, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(home).expanduser() / "hub"


def in_hub_cache(name: str, cache: Path) -> Path | None:
    """The snapshot of model `name` ("org/model") holding a tokenizer.json: the one `refs/main`
    names, else the newest."""
    if "/" not in name or name.startswith(("/", ".")):
        return None
    repo = cache / ("models--" + name.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    main = repo / "refs" / "main"
    if main.is_file():
        pinned = snapshots / main.read_text(encoding="utf-8").strip()
        if (pinned / "tokenizer.json").is_file():
            return pinned
    found = [d for d in snapshots.iterdir() if (d / "tokenizer.json").is_file()]
    return max(found, key=lambda d: d.stat().st_mtime) if found else None


def local_path(name: str, cache: Path) -> Path | None:
    """`name` as a tokenizer on this host: a directory with tokenizer.json, a readable GGUF file,
    or a model id in the hub cache."""
    if not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return path if importlib.util.find_spec("gguf") is not None else None
    return in_hub_cache(name, cache)


def named_by(models: Any, infos: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, where it was said) for each model path or id the engine's answers give, most precise first."""
    names: list[tuple[str, str]] = []
    data = models.get("data") if isinstance(models, dict) else None
    cards = [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []
    names += [(str(c["root"]), "/v1/models root") for c in cards if isinstance(c.get("root"), str)]
    for path, answer in infos.items():
        if isinstance(answer, dict):
            names += [(str(answer[k]), f"{path} {k}") for k in PATH_KEYS if isinstance(answer.get(k), str)]
    names += [(m, "/v1/models id") for m in served_models(models)]
    return names


def first_local(names: Iterable[tuple[str, str]], cache: Path | None = None) -> Found | None:
    cache = cache if cache is not None else hub_cache()
    for name, source in names:
        path = local_path(name, cache)
        if path is not None:
            hub = "" if Path(name).expanduser().exists() else " (Hugging Face cache)"
            return Found(str(path), source + hub)
    return None


async def discover(
    session: aiohttp.ClientSession, url: str, models: Any, headers: Mapping[str, str]
) -> Found | None:
    """The served model's tokenizer on this host, or None (before the clock: two GETs at most)."""
    infos = {path: await get_json(session, f"{url}{path}", headers) for path in INFO_PATHS}
    return first_local(named_by(models, infos))
