"""Finding the served tokenizer on this host from what the engine says it serves."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import aiohttp
import pytest

from replayproxy.replay import tokenizer_discovery as discovery
from tests.servers import sim


def hub_snapshot(cache: Path, name: str, revision: str, main: bool = True) -> Path:
    repo = cache / ("models--" + name.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_text("{}")
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_the_answers_name_model_paths_most_precise_first() -> None:
    models = {"data": [{"id": "served", "root": "/models/llama"}]}
    infos = {"/get_server_info": {"tokenizer_path": "/tok", "model_path": "/m"}, "/props": None}
    assert discovery.named_by(models, infos) == [
        ("/models/llama", "/v1/models root"),
        ("/tok", "/get_server_info tokenizer_path"),
        ("/m", "/get_server_info model_path"),
        ("served", "/v1/models id"),
    ]
    assert discovery.named_by(None, {"/props": "not a dict"}) == []


def test_a_model_id_is_found_in_the_hub_cache_at_the_revision_main_names(tmp_path: Path) -> None:
    hub_snapshot(tmp_path, "org/model", "old", main=False)
    pinned = hub_snapshot(tmp_path, "org/model", "abc123")
    assert discovery.in_hub_cache("org/model", tmp_path) == pinned
    assert discovery.in_hub_cache("org/other", tmp_path) is None
    assert discovery.in_hub_cache("no-slash", tmp_path) is None
    names = [("nowhere/x", "/v1/models root"), ("org/model", "/v1/models id")]
    found = discovery.first_local(names, tmp_path)
    assert found == discovery.Found(str(pinned), "/v1/models id (Hugging Face cache)")


def test_a_directory_needs_its_tokenizer_json_and_a_gguf_file_the_gguf_package(tmp_path: Path) -> None:
    assert discovery.local_path(str(tmp_path), tmp_path) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    assert discovery.local_path(str(tmp_path), tmp_path) == tmp_path
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    readable = importlib.util.find_spec("gguf") is not None
    assert discovery.local_path(str(gguf), tmp_path) == (gguf if readable else None)


def test_the_hub_cache_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert discovery.hub_cache() == tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert discovery.hub_cache() == tmp_path / "elsewhere"


def test_the_sim_names_the_directory_of_the_tokenizer_it_serves(bpe_tokenizer: Path) -> None:
    async def found(url: str) -> discovery.Found | None:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as resp:
            models = await resp.json()
            return await discovery.discover(session, url, models, {})

    with sim("--tokenizer", str(bpe_tokenizer)) as server:
        assert asyncio.run(found(server.url)) == discovery.Found(
            os.path.realpath(bpe_tokenizer.parent), "/v1/models root"
        )
    with sim() as server:  # its own word tokenizer: nothing on disk to find
        assert asyncio.run(found(server.url)) is None
