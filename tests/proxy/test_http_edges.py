"""HTTP edge cases through the proxy on loopback: Upgrade, pipelining after Connection: close, path
prefix escapes, trailers, head-size caps, connection caps, file-descriptor exhaustion and the fields
an engine moves into the usage event the proxy hides."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from replayproxy.clock import now_ns
from tests.proxy.helpers import (
    CaptureSink,
    RawRequest,
    RawUpstream,
    admin_url,
    header,
    proxy,
    raw_exchange,
    run,
)
from tests.servers import run_server


def echo(request: RawRequest) -> None:
    body = request.body
    request.connection.write(b"HTTP/1.1 200 OK\r\nX-Target: %b\r\nContent-Length: %d\r\n\r\n%b"
                             % (request.target, len(body), body))  # fmt: skip


async def read_all(url: str, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send `data`, then read until the proxy closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read(-1)
    finally:
        writer.close()


# ------------------------------------------------------------------ Upgrade


@pytest.mark.parametrize("body", [b'{"prompt":"hi"}', b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"])
def test_a_post_offering_upgrade_is_forwarded_as_an_ordinary_request(body: bytes) -> None:
    """`curl --http2 -X POST -d ...` offers h2c on a request with a body: answered as HTTP/1.1."""

    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url) as px:
            request = (
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Length: %d\r\n\r\n%b"
                % (len(body), body)
            )
            started = now_ns()
            [response] = await raw_exchange(px.url, request + b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (response.status, response.body) == (200, body)
            assert now_ns() - started < 2e9
            assert [r.target for r in up.requests[:1]] == [b"/v1/completions"]
            assert up.requests[0].body == body
            assert header(up.requests[0].headers, b"upgrade") is None
            [again] = await raw_exchange(px.url, request)
            assert again.status == 200

    run(main())


@contextlib.asynccontextmanager
async def websocket_like_upstream(answer_101: bool) -> AsyncIterator[tuple[str, list[bytes]]]:
    """Answers an Upgrade offer with 101 and then echoes bytes upper-cased, or declines with 200."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            heads.append(head)
            if answer_101 and b"Upgrade: websocket" in head:
                writer.write(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                )
                while data := await reader.read(1024):
                    writer.write(data.upper())
                break
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\ndeclined")
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", heads
    finally:
        server.close()


def test_an_upgrade_answered_101_becomes_a_tunnel() -> None:
    async def main() -> None:
        async with websocket_like_upstream(True) as (url, heads), proxy(url) as px:
            host, port = px.url.removeprefix("http://").split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nhello"
            )
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 101 ") and b"Upgrade: websocket" in head
                assert await reader.readexactly(5) == b"HELLO"  # sent before the 101: held, then tunnelled
                writer.write(b"more")
                assert await reader.readexactly(4) == b"MORE"
            writer.close()
            assert b"Upgrade: websocket" in heads[0] and b"Connection: upgrade" in heads[0]

    run(main())


def test_an_upgrade_answered_otherwise_stays_http() -> None:
    async def main() -> None:
        async with websocket_like_upstream(False) as (url, _), proxy(url) as px:
            offer = b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            first, second = await raw_exchange(
                px.url, offer + b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n", responses=2
            )
            assert (first.status, first.body, second.status, second.body) == (
                200,
                b"declined",
                200,
                b"declined",
            )

    run(main())


# ------------------------------------------------------------------ pipelining after Connection: close


@pytest.mark.parametrize(
    "pair",
    [
        b"GET /A HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /B HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /A HTTP/1.0\r\n\r\nGET /B HTTP/1.0\r\n\r\n",
    ],
)
def test_requests_after_connection_close_are_discarded_and_the_first_answered(pair: bytes) -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url) as px:
            answer = await read_all(px.url, pair)
            assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:80]
            assert (
                b"X-Target: /A" in answer and b"/B" not in answer and b"400" not in answer.split(b"\r\n")[0]
            )
            assert [r.target for r in up.requests] == [b"/A"]

    run(main())


# ------------------------------------------------------------------ the upstream's path prefix


@pytest.mark.parametrize(
    ("target", "seen"),
    [
        (b"/../admin", b"/api/v1/admin"),
        (b"http://x/../../admin", b"/api/v1/admin"),
        (b"/v1/./a/b/../models?next=/../x", b"/api/v1/v1/a/models?next=/../x"),
        (b"/a/..", b"/api/v1/"),
        (b"/plain/path", b"/api/v1/plain/path"),
    ],
)
def test_dot_segments_cannot_climb_out_of_the_upstream_prefix(target: bytes, seen: bytes) -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url + "/api/v1") as px:
            [response] = await raw_exchange(px.url, b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n" % target)
            assert response.status == 200
            assert [r.target for r in up.requests] == [seen]

    run(main())


@pytest.mark.parametrize("target", [b"/%2e%2e/admin", b"/a/%2E%2e/%2e%2E/admin", b"/%2e/x"])
def test_percent_encoded_dot_segments_are_refused_under_a_prefix(target: bytes) -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url + "/api/v1") as px:
            [response] = await raw_exchange(px.url, b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n" % target)
            assert response.status == 400
            assert up.requests == []

    run(main())


# ------------------------------------------------------------------ trailers and head sizes


def trailing(request: RawRequest) -> None:
    request.connection.write(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        b"5\r\nhello\r\n0\r\nX-Checksum: abc123\r\n\r\n"
    )


@pytest.mark.parametrize("te", [True, False])
def test_trailers_pass_when_the_client_accepts_them(te: bool) -> None:
    async def main() -> None:
        async with RawUpstream(trailing) as up, proxy(up.url) as px:
            asked = b"TE: trailers\r\n" if te else b""
            [response] = await raw_exchange(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n%b\r\n" % asked)
            assert (response.body, response.complete) == (b"hello", True)
            assert header(response.headers, b"x-checksum") == (b"abc123" if te else None)

    run(main())


def test_an_oversized_response_head_is_a_502() -> None:
    def huge(request: RawRequest) -> None:
        request.connection.write(
            b"HTTP/1.1 200 OK\r\nX-Big: %b\r\nContent-Length: 2\r\n\r\nok" % (b"a" * 100_000)
        )

    async def main() -> None:
        async with RawUpstream(huge) as up, proxy(up.url, max_response_head_bytes=65536) as px:
            [response] = await raw_exchange(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert response.status == 502
            assert px.metrics.hot.upstream_errors == {"bad_stream": 1}

    run(main())


# ------------------------------------------------------------------ client connection limits


def test_connections_past_the_limit_are_refused_at_once_and_counted() -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url, max_client_connections=3) as px:
            host, port = px.url.removeprefix("http://").split(":")
            held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
            await asyncio.sleep(0.1)
            started = now_ns()
            answer = await read_all(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 503 ") and now_ns() - started < 1e9
            assert px.metrics.hot.refused["limit"] == 1
            async with aiohttp.ClientSession() as session:
                held[0][1].close()
                await asyncio.sleep(0.1)
                async with session.get(px.url + "/ok") as resp:
                    assert resp.status == 200
            for _, writer in held[1:]:
                writer.close()

    run(main())


@pytest.mark.skipif(sys.platform != "linux", reason="descriptor limits are set with setrlimit on Linux")
def test_running_out_of_descriptors_is_counted_and_logged_while_admin_answers(tmp_path: object) -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up:
            argv = ["tests.proxy.fd_limited", "80", "proxy", "--upstream", up.url, "--listen", "127.0.0.1:0",
                    "--admin-listen", "127.0.0.1:0", "--no-record", "--log-interval-s", "60"]  # fmt: skip
            with run_server(argv) as server:
                admin = await asyncio.to_thread(admin_url, server)
                host, port = server.url.removeprefix("http://").split(":")
                sockets = []
                for _ in range(120):  # far more than 80 descriptors allow
                    sock = socket.socket()
                    sock.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        sock.connect((host, int(port)))
                    sockets.append(sock)
                await asyncio.sleep(0.5)
                async with aiohttp.ClientSession() as session:
                    for _ in range(5):  # the admin listener keeps answering meanwhile
                        async with session.get(admin + "/healthz") as resp:
                            assert resp.status == 200
                    async with session.get(admin + "/metrics") as resp:
                        metrics = await resp.text()
                for sock in sockets:
                    sock.close()
                await asyncio.sleep(0.5)
                async with aiohttp.ClientSession() as session, session.get(server.url + "/after") as resp:
                    assert resp.status == 200  # serving again once descriptors are free
            series = 'replayproxy_client_connections_refused_total{reason="fd_exhausted"}'
            refused = next(line for line in metrics.splitlines() if line.startswith(series))
            assert float(refused.split()[-1]) >= 1
            logged = [line for line in server.output if "out of file descriptors" in line]
            assert len(logged) == 1, server.output[-20:]  # rate-limited: once per interval

    run(main(), timeout_s=60)


# ------------------------------------------------------------------ nothing lost to usage injection


def vllm_like(request: RawRequest) -> None:
    """A stream shaped like vLLM's: asked for usage, it moves `system_fingerprint` into the usage chunk."""
    asked = b'"include_usage":true' in request.body
    envelope = b'"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m"'
    events = [
        b'{%b,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
        % envelope,
        b'{%b,"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}' % envelope,
    ]
    if asked:
        events.append(b'{%b,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}' % envelope)
        events.append(b'{%b,"system_fingerprint":"fp_vllm","choices":[],"usage":{"prompt_tokens":3,'
                      b'"completion_tokens":1,"total_tokens":4}}' % envelope)  # fmt: skip
    else:
        events.append(b'{%b,"system_fingerprint":"fp_vllm","choices":[{"index":0,"delta":{},'
                      b'"finish_reason":"stop"}]}' % envelope)  # fmt: skip
    body = b"".join(b"data: %b\n\n" % e for e in events) + b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body)
    request.connection.write(head + body)


def fields(body: bytes) -> tuple[str, set[str]]:
    """The content the client read, and every top-level field any of its events carried."""
    content, seen = "", set()
    for line in body.split(b"\n\n"):
        if line.startswith(b"data: {"):
            event = orjson.loads(line[6:])
            seen.update(event)
            if "system_fingerprint" in event:
                seen.add("fingerprint:" + event["system_fingerprint"])
            for choice in event["choices"]:
                content += choice["delta"].get("content", "")
    return content, seen


def test_a_field_the_engine_moves_into_the_usage_event_still_reaches_the_client() -> None:
    async def main() -> None:
        sink = CaptureSink()
        async with RawUpstream(vllm_like) as up, proxy(up.url, observer=sink) as px:
            request = orjson.dumps(
                {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            )
            async with aiohttp.ClientSession() as session:
                async with session.post(up.url + "/v1/chat/completions", data=request) as resp:
                    direct = fields(await resp.read())
                async with session.post(px.url + "/v1/chat/completions", data=request) as resp:
                    proxied = fields(await resp.read())
            assert sink.captures[0].injected_usage  # the proxy did ask for usage
            assert b"include_usage" in up.requests[1].body
            assert proxied[0] == direct[0] == "hi"
            assert "fingerprint:fp_vllm" in direct[1]
            assert direct[1] <= proxied[1] and "usage" not in proxied[1]

    run(main())
