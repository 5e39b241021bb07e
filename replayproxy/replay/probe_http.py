"""The target's small HTTP endpoints (describe, tokenize, calibrate, reset, contract) as real servers allow.

Servers close connections they advertised as keep-alive: llama.cpp after every streamed response,
every server after an idle timeout (5 s for llama.cpp and uvicorn) that aiohttp's pool does not
read. A probe that reuses such a connection fails with "Can not write request body" or "Server
disconnected" although the target is fine. Probes are idempotent, so one that fails on its
connection is sent again on a fresh one; idle connections are kept for less than those timeouts.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

KEEPALIVE_S = 2.0  # below the common 5 s server idle timeout
ATTEMPTS = 3


def session(total_s: float) -> aiohttp.ClientSession:
    """A session for probes: `total_s` per request, idle connections dropped after KEEPALIVE_S."""
    connector = aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=total_s), connector=connector)


def _retryable(error: aiohttp.ClientConnectionError) -> bool:
    """The connection broke under the request; not: the target refused connections or timed out."""
    return not isinstance(error, aiohttp.ClientConnectorError | aiohttp.ServerTimeoutError)


async def request(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    headers: Mapping[str, str],
    data: bytes | None = None,
) -> tuple[int, bytes]:
    """(status, body); a broken connection is retried on a fresh one, ATTEMPTS in all, then raised."""
    try:
        return await _once(http, method, url, headers, data)
    except aiohttp.ClientConnectionError as e:
        if not _retryable(e):
            raise
        last = e
    for _ in range(ATTEMPTS - 1):
        fresh = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(timeout=http.timeout, connector=fresh) as one_off:
            try:
                return await _once(one_off, method, url, headers, data)
            except aiohttp.ClientConnectionError as e:
                if not _retryable(e):
                    raise
                last = e
    raise last


async def _once(
    http: aiohttp.ClientSession, method: str, url: str, headers: Mapping[str, str], data: bytes | None
) -> tuple[int, bytes]:
    async with http.request(method, url, data=data, headers=headers) as resp:
        return resp.status, await resp.read()
