"""Transparency of the forwarding path at the byte level: heads, bodies, framing, keep-alive, pipelining."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.proxy.helpers import RawRequest, RawUpstream, header, proxy, raw_exchange, run


def answer(status: int, body: bytes, *headers: tuple[bytes, bytes]) -> bytes:
    lines = b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    return b"HTTP/1.1 %d Whatever Reason\r\n%bContent-Length: %d\r\n\r\n%b" % (status, lines, len(body), body)


def echo(request: RawRequest) -> None:
    request.connection.write(answer(200, request.body, (b"X-Target", request.target)))


def test_request_passes_through_minus_hop_by_hop_headers() -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url) as px:
            request = (
                b"PUT /any/path;x?q=1&r=%20 HTTP/1.1\r\nHost: example.test\r\nX-Mixed-Case: Value, Kept\r\n"
                b"Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n"
                b"Proxy-Connection: keep-alive\r\nUpgrade: h2c\r\nAuthorization: Bearer abc\r\n"
                b"Content-Length: 5\r\n\r\nhello"
            )
            [response] = await raw_exchange(px.url, request)
            seen = up.requests[0]
            assert (seen.method, seen.target, seen.body) == (b"PUT", b"/any/path;x?q=1&r=%20", b"hello")
            names = [n for n, _ in seen.headers]
            assert names == [b"Host", b"X-Mixed-Case", b"Authorization", b"Content-Length"]
            assert header(seen.headers, b"host") == b"example.test"
            assert header(seen.headers, b"x-mixed-case") == b"Value, Kept"
            assert (response.status, response.reason, response.body) == (200, b"Whatever Reason", b"hello")

    run(main())


def test_response_headers_status_and_body_come_back_unchanged() -> None:
    def script(request: RawRequest) -> None:
        request.connection.write(
            b"HTTP/1.1 418 I'm a teapot\r\nX-Custom: A\r\nset-cookie: a=1\r\nset-cookie: b=2\r\n"
            b"Connection: X-Private\r\nX-Private: no\r\nKeep-Alive: timeout=9\r\n"
            b"Content-Length: 4\r\n\r\nbrew"
        )

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            [response] = await raw_exchange(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (response.status, response.reason, response.body) == (418, b"I'm a teapot", b"brew")
            assert response.headers == [
                (b"X-Custom", b"A"),
                (b"set-cookie", b"a=1"),
                (b"set-cookie", b"b=2"),
                (b"Content-Length", b"4"),
            ]

    run(main())


def test_bodiless_responses_head_204_304() -> None:
    def script(request: RawRequest) -> None:
        status = int(request.target.strip(b"/") or b"200")
        if request.method == b"HEAD":
            request.connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
        else:
            request.connection.write(b"HTTP/1.1 %d X\r\nETag: e\r\n\r\n" % status)

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            async with aiohttp.ClientSession() as session:
                for path, status in (("/204", 204), ("/304", 304)):
                    async with session.get(px.url + path) as resp:
                        assert resp.status == status and await resp.read() == b""
                for _ in range(2):
                    async with session.head(px.url + "/") as resp:
                        assert resp.headers["Content-Length"] == "1234"
            assert len(up.connections) <= 2  # bodiless answers kept the upstream connection reusable

    run(main())


def test_a_second_response_in_the_same_read_reaches_nobody() -> None:
    def script(request: RawRequest) -> None:
        request.connection.write(answer(200, b"first") + answer(500, b"unasked"))

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            async with aiohttp.ClientSession() as session:
                for _ in range(3):
                    async with session.get(px.url + "/") as resp:
                        assert (resp.status, await resp.read()) == (200, b"first")

    run(main())


def test_chunked_request_body_and_chunked_response() -> None:
    def script(request: RawRequest) -> None:
        assert header(request.headers, b"transfer-encoding") == b"chunked"
        request.connection.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n"
            + b"%x\r\n%b\r\n" % (len(request.body), request.body)
            + b"0\r\nX-Trailer: t\r\n\r\n"
        )

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            data = (
                b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n"
            )
            [response] = await raw_exchange(px.url, data)
            assert up.requests[0].body == b"wikipedia"
            assert response.body == b"abcwikipedia" and response.complete
            assert header(response.headers, b"transfer-encoding") == b"chunked"

    run(main())


def test_keep_alive_on_both_sides_and_pool_reuse() -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url) as px:
            connector = aiohttp.TCPConnector(limit=1)
            async with aiohttp.ClientSession(connector=connector) as session:
                for i in range(20):
                    async with session.post(px.url + f"/k/{i}", data=b"x" * i) as resp:
                        assert await resp.read() == b"x" * i
            assert len(up.connections) == 1
            assert len(px.forwarder.clients) <= 1

    run(main())


def test_pipelined_requests_are_answered_in_order() -> None:
    async def script(request: RawRequest) -> None:
        if request.target == b"/slow":
            await asyncio.sleep(0.05)
        echo(request)

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            data = b"".join(
                b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (path, len(path), path)
                for path in (b"/slow", b"/a", b"/slow", b"/b")
            )
            responses = await raw_exchange(px.url, data, responses=4)
            assert [r.body for r in responses] == [b"/slow", b"/a", b"/slow", b"/b"]

    run(main())


def test_http10_client_gets_close_delimited_body() -> None:
    def script(request: RawRequest) -> None:
        request.connection.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            [response] = await raw_exchange(px.url, b"GET / HTTP/1.0\r\n\r\n")
            assert response.body == b"hello"
            assert header(response.headers, b"transfer-encoding") is None
            assert header(up.requests[0].headers, b"host") == up.url.removeprefix("http://").encode()

    run(main())


def test_close_delimited_upstream_body_reaches_an_http11_client_close_delimited() -> None:
    def script(request: RawRequest) -> None:
        request.connection.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
        request.connection.transport.close()

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            [response] = await raw_exchange(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert response.body == b"until the end"  # the reader saw the close end it, as direct
            assert header(response.headers, b"transfer-encoding") is None
            assert header(response.headers, b"connection") == b"close"

    run(main())


def test_expect_100_continue_is_answered_by_the_proxy() -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url) as px:
            data = b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok"
            interim, response = await raw_exchange(px.url, data, responses=2)
            assert (interim.status, response.status, response.body) == (100, 200, b"ok")
            assert header(up.requests[0].headers, b"expect") is None

    run(main())


def test_forwarded_headers_only_when_configured() -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up:
            async with proxy(up.url) as px:
                await raw_exchange(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            async with proxy(up.url, forwarded_headers="both") as px:
                await raw_exchange(px.url, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            plain, added = up.requests
            assert (
                header(plain.headers, b"x-forwarded-for") is None
                and header(plain.headers, b"forwarded") is None
            )
            assert header(added.headers, b"x-forwarded-for") == b"127.0.0.1"
            assert header(added.headers, b"forwarded") == b"for=127.0.0.1"

    run(main())


def test_bad_requests_are_refused_without_reaching_upstream() -> None:
    async def main() -> None:
        async with RawUpstream(echo) as up, proxy(up.url, max_request_head_bytes=1024) as px:
            [garbage] = await raw_exchange(px.url, b"NOT HTTP AT ALL\r\n\r\n")
            [large] = await raw_exchange(px.url, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n")
            [connect] = await raw_exchange(px.url, b"CONNECT example.test:443 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (garbage.status, large.status, connect.status) == (400, 431, 400)
            assert up.requests == []

    run(main())


def test_a_large_body_streams_through_with_a_slow_reader() -> None:
    size = 8 << 20

    def script(request: RawRequest) -> None:
        request.connection.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for i in range(size // 65536):
            request.connection.write(bytes([i % 251]) * 65536)

    async def main() -> None:
        async with RawUpstream(script) as up, proxy(up.url) as px:
            async with aiohttp.ClientSession() as session, session.get(px.url) as resp:
                total = 0
                async for piece in resp.content.iter_chunked(1 << 20):
                    total += len(piece)
                    if total < 2 << 20:
                        await asyncio.sleep(
                            0.05
                        )  # slow reader: the proxy must pause the upstream, not buffer
                assert total == size

    run(main())
