"""The upstream pool (replayproxy/proxy/upstream.py) against a real loopback server: connections
are lent, reused most-recent first, bounded, queued for, and their failures and losses reported
to the borrower."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from replayproxy.proxy.seam import UpstreamLink
from replayproxy.proxy.upstream import UpstreamConnection, UpstreamPool
from tests.proxy.helpers import run


class Borrower:
    """Records what the pool and the connection report; `ready` resolves with the lent connection."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.ready: asyncio.Future[UpstreamLink] = asyncio.get_running_loop().create_future()
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def upstream_ready(self, conn: UpstreamLink) -> None:
        self.events.append(("ready", conn))
        self.ready.set_result(conn)

    def upstream_failed(self, error: str) -> None:
        self.events.append(("failed", error))
        self.done.set_result(error)

    def upstream_data(self, data: bytes) -> None:
        self.events.append(("data", data))
        if data.endswith(b"\n") and not self.done.done():
            self.done.set_result("data")

    def upstream_lost(self) -> None:
        self.events.append(("lost", None))
        if not self.done.done():
            self.done.set_result("lost")

    def upstream_pause(self, paused: bool) -> None:
        self.events.append(("pause", paused))


@asynccontextmanager
async def echo_server(close_after_reply: bool = False) -> AsyncIterator[tuple[int, list[int]]]:
    """A line echo server; yields its port and the count of connections it accepted."""
    accepted: list[int] = []
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writers.append(writer)
        while line := await reader.readline():
            writer.write(b"echo " + line)
            await writer.drain()
            if close_after_reply:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        for writer in writers:  # connections the pool still holds
            writer.transport.abort()
        await server.wait_closed()


def pool_for(port: int, **options: int) -> UpstreamPool:
    settings = {"max_connections": 4, "max_idle": 4} | options
    return UpstreamPool("127.0.0.1", port, tls=None, connect_timeout_s=5.0, **settings)


def test_a_released_connection_is_lent_again_without_reconnecting() -> None:
    async def main() -> None:
        async with echo_server() as (port, accepted):
            pool = pool_for(port)
            first = Borrower()
            pool.acquire(first)
            conn = await first.ready
            conn.write(b"one\n")
            assert await first.done == "data" and ("data", b"echo one\n") in first.events
            pool.release(conn, reusable=True, tick=1)
            assert pool.idle == [conn] and pool.open == 1
            second = Borrower()
            pool.acquire(second)
            assert await second.ready is conn and pool.idle == []
            conn.write(b"two\n")
            assert await second.done == "data" and ("data", b"echo two\n") in second.events
            assert len(accepted) == 1
            pool.release(conn, reusable=False, tick=2)  # not reusable: closed, not kept
            await asyncio.sleep(0.05)
            assert pool.idle == [] and pool.open == 0

    run(main())


def test_the_bound_queues_borrowers_until_a_release_and_forget_drops_one() -> None:
    async def main() -> None:
        async with echo_server() as (port, accepted):
            pool = pool_for(port, max_connections=1)
            first, second, third = Borrower(), Borrower(), Borrower()
            pool.acquire(first)
            pool.acquire(second)
            pool.acquire(third)
            conn = await first.ready
            assert list(pool.waiting) == [second, third] and pool.open == 1
            pool.forget(third)
            pool.forget(third)  # twice is harmless
            pool.release(conn, reusable=True, tick=1)
            assert await second.ready is conn and not pool.waiting and len(accepted) == 1
            assert third.events == []

    run(main())


def test_a_refused_connect_is_reported_and_frees_its_slot() -> None:
    async def main() -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]  # nobody listens here once the probe is closed
        pool = pool_for(port)
        borrower = Borrower()
        pool.acquire(borrower)
        assert await borrower.done == "connect" and pool.open == 0

    run(main())


def test_a_connection_the_server_closes_is_reported_lost_and_leaves_the_idle_list() -> None:
    async def main() -> None:
        async with echo_server(close_after_reply=True) as (port, _):
            pool = pool_for(port)
            borrower = Borrower()
            pool.acquire(borrower)
            conn = await borrower.ready
            conn.write(b"bye\n")
            await borrower.done
            for _ in range(100):
                if ("lost", None) in borrower.events:
                    break
                await asyncio.sleep(0.01)
            assert ("lost", None) in borrower.events and pool.open == 0
            assert isinstance(conn, UpstreamConnection) and conn.lost
            idle = Borrower()
            pool.acquire(idle)  # a lost connection is never lent again
            assert await idle.ready is not conn

    run(main())


def test_idle_connections_close_by_age_and_an_idle_one_that_talks_is_dropped() -> None:
    async def main() -> None:
        async with echo_server() as (port, _):
            pool = pool_for(port, max_idle=2)
            borrowers = [Borrower() for _ in range(3)]
            for b in borrowers:
                pool.acquire(b)
            conns = [await b.ready for b in borrowers]
            for tick, conn in enumerate(conns):
                pool.release(conn, reusable=True, tick=tick)
            assert pool.idle == conns[:2]  # beyond max_idle the connection is closed
            pool.close_idle(older_than_tick=1)
            assert pool.idle == [conns[1]]
            assert isinstance(conns[1], UpstreamConnection)
            conns[1].data_received(b"unasked bytes")  # an idle peer must stay silent
            await asyncio.sleep(0.05)
            assert pool.idle == [] and pool.open == 0
            pool.close_idle()

    run(main())


def test_an_idle_connection_whose_close_waits_unread_in_the_kernel_is_never_lent() -> None:
    """The server closes the connection after its reply while the loop is busy, so only the kernel
    knows (a keep-alive timer firing just before the next request): the pool connects anew rather
    than write a request that could not be proven unread. A live idle connection is lent again."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    close_now = threading.Event()

    def serve() -> None:  # a blocking server on its own thread: it closes while the loop is stopped
        for n in range(2):
            conn, _ = listener.accept()
            accepted.append(conn)
            conn.recv(100)
            conn.sendall(b"echo\n")
            if n == 0:
                close_now.wait(10)
                conn.close()

    async def main() -> None:
        pool = pool_for(listener.getsockname()[1])
        first = Borrower()
        pool.acquire(first)
        conn = await first.ready
        conn.write(b"hi\n")
        assert await first.done == "data"
        pool.release(conn, reusable=True, tick=1)
        close_now.set()
        time.sleep(0.1)  # the loop does not run: the server's FIN waits in the kernel
        assert isinstance(conn, UpstreamConnection) and not conn.lost
        second = Borrower()
        pool.acquire(second)
        fresh = await second.ready
        assert fresh is not conn
        fresh.write(b"hi\n")
        assert await second.done == "data" and len(accepted) == 2
        pool.release(fresh, reusable=True, tick=2)
        live = Borrower()
        pool.acquire(live)  # nothing waits on this one: lent again, its bytes untouched
        assert await live.ready is fresh and len(accepted) == 2
        pool.release(fresh, reusable=False, tick=3)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        run(main())
    finally:
        close_now.set()
        thread.join(5)
        for sock in (*accepted, listener):
            sock.close()
