"""Whether the upstream answers, for `/readyz`: one small GET on its own connection, cached briefly.

Off the forwarding path (the admin listener asks, at most once per `CACHE_S` whatever the number of
probes): a fresh connection each time, so a pooled connection is never borrowed and the answer
is about the engine now. Any status below 500 means it answers (a gateway without a health path
says 404 and still serves); 5xx (llama.cpp's 503 while it loads the model, TGI's while it warms
up), a refused connect and silence within `TIMEOUT_S` mean not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit

from replayproxy.clock import now_ns
from replayproxy.tasks import spawn

CACHE_S = 1.0  # one probe serves every readiness question asked within this
TIMEOUT_S = 2.0  # connect, send and read the status line within this


class UpstreamProbe:
    """`await check()` -> "" when the upstream answers, else why not."""

    def __init__(self, upstream_url: str, path: str) -> None:
        parts = urlsplit(upstream_url)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._tls else 80)
        target = parts.path.rstrip("/") + "/" + path.lstrip("/")
        host = parts.netloc.rpartition("@")[2]  # never the URL's credentials
        head = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        self._request = head.encode("latin-1")
        self._result = ""
        self._at_ns = -1  # when `_result` was found; -1: never
        self._running: asyncio.Task[str] | None = None

    async def check(self) -> str:
        if self._at_ns >= 0 and now_ns() - self._at_ns < CACHE_S * 1e9:
            return self._result
        if self._running is None:  # concurrent questions share one probe
            self._running = spawn(self._probe(), name="readiness-probe")
        running = self._running
        try:
            result = await asyncio.shield(running)
        finally:
            if running.done() and self._running is running:
                self._running = None
        self._result, self._at_ns = result, now_ns()
        return result

    async def _probe(self) -> str:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    self._host, self._port, ssl=self._tls, server_hostname=self._host if self._tls else None
                )
                writer.write(self._request)
                line = await reader.readuntil(b"\r\n")
        except TimeoutError:
            return f"no answer within {TIMEOUT_S:g} s"
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            return f"unreachable ({type(e).__name__})"
        finally:
            if writer is not None:
                writer.transport.abort()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
        version, _, rest = line.partition(b" ")
        status = rest[:3]
        if not version.startswith(b"HTTP/") or not status.isdigit():
            return "not HTTP"
        return "" if int(status) < 500 else f"status {int(status)}"
