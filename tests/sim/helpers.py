"""Small clients for the sim tests: raw HTTP (for error cases), the truth log and /metrics."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

MODEL = "sim-llama-3.1-8b"


def chat_body(text: str = "Hello, simulated world!", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **fields}


async def _post(url: str, data: bytes) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.read()


def post(url: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    """POST raw bytes or a JSON object; returns (status, parsed JSON or raw bytes)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    status, raw = asyncio.run(_post(url, data))
    try:
        return status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return status, raw


async def _get(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.read()


def get(url: str) -> tuple[int, bytes]:
    return asyncio.run(_get(url))


def read_truth(path: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The truth log once it has `count` lines: a line is written just after the request's last
    write, so a client that has its answer may still be a moment ahead of the log."""
    deadline = time.perf_counter() + timeout_s
    while True:
        lines = path.read_bytes().splitlines() if path.exists() else []
        if len(lines) >= count or time.perf_counter() > deadline:
            return [orjson.loads(line) for line in lines]
        time.sleep(0.01)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled-by-us sample `name{model_name=...}` in Prometheus text."""
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def first_content_ns(record: dict[str, Any]) -> int:
    """Wall-clock time of the first chunk carrying generated text (reasoning or content)."""
    kinds = record["kinds"]
    index = next(i for i, k in enumerate(kinds) if k in "cRb")
    return int(record["chunk_ns"][index])


def content_gaps_ns(record: dict[str, Any]) -> list[int]:
    times = [t for t, k in zip(record["chunk_ns"], record["kinds"], strict=True) if k in "cR"]
    return [b - a for a, b in zip(times, times[1:], strict=False)]
