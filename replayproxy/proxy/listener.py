"""The forwarding listener's accept loop, so that running out of room is refused, counted and logged.

Past `max_client_connections` a new connection gets a 503 and is closed at once. When the process
runs out of file descriptors (EMFILE/ENFILE, which the event loop's own accept hides), the
descriptors held in reserve here are given up so the admin listener keeps room to answer, and
accepting pauses until twice the reserve could be opened again (connections have gone); meanwhile
waiting connections are refused through one spare descriptor. Both are counted by reason and
logged at most once per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Callable

from replayproxy.errors import CannotListen
from replayproxy.proxy.observe import RateLimitedLog
from replayproxy.tasks import spawn

RESERVE_FDS = 16
ACCEPTS_PER_WAKE = 64
RETRY_S = 0.1
_REFUSAL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Listener:
    """Accepts for one listening socket and hands each connection to `factory`'s protocol."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        *,
        open_clients: Callable[[], int],
        max_clients: int,
        refused: dict[str, int],
        log: RateLimitedLog,
    ) -> None:
        self.sock = sock
        self._factory = factory
        self._open_clients = open_clients
        self._max_clients = max_clients
        self._refused = refused
        self._log = log
        self._reserve: list[int] = []
        self._spare = -1  # kept even when the reserve is given up: room to refuse with
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retry: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        self._take_reserve(RESERVE_FDS)
        self._spare = os.open(os.devnull, os.O_RDONLY)
        self._loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self._loop is not None and self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
        if self._retry is not None:
            self._retry.cancel()
        self.sock.close()
        self._give_reserve()
        if self._spare >= 0:
            os.close(self._spare)
            self._spare = -1

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _OUT_OF_FDS:
                    self._out_of_fds()
                    return
                continue  # ECONNABORTED and the like: that client gave up, the next may not have
            if self._open_clients() >= self._max_clients:
                self._refuse(conn, "limit")
                continue
            conn.setblocking(False)
            spawn(self._attach(conn), name="client-accept")

    async def _attach(self, conn: socket.socket) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:  # gone before its transport was made
            conn.close()

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        self._refused[reason] = self._refused.get(reason, 0) + 1
        try:
            conn.setblocking(False)
            conn.send(_REFUSAL)
        except OSError:
            pass  # refused either way
        finally:
            conn.close()

    def _out_of_fds(self) -> None:
        self._log("fds", "out of file descriptors: refusing new connections; raise the limit (ulimit -n) "
                         "or lower --max-client-connections")  # fmt: skip
        self._give_reserve()
        assert self._loop is not None
        self._loop.remove_reader(self.sock.fileno())
        self._refuse_waiting()
        self._retry = self._loop.call_later(RETRY_S, self._resume)

    def _refuse_waiting(self) -> None:
        """Answer what waits in the backlog with a 503, through the spare descriptor."""
        if self._spare >= 0:
            os.close(self._spare)
            self._spare = -1
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                conn, _ = self.sock.accept()
            except OSError:
                break
            self._refuse(conn, "fd_exhausted")
        with contextlib.suppress(OSError):
            self._spare = os.open(os.devnull, os.O_RDONLY)

    def _resume(self) -> None:
        """Accept again once twice the reserve could be opened (descriptors were freed)."""
        assert self._loop is not None
        self._retry = None
        self._refuse_waiting()
        if self._take_reserve(2 * RESERVE_FDS):
            for fd in self._reserve[RESERVE_FDS:]:
                os.close(fd)
            del self._reserve[RESERVE_FDS:]
            self._loop.add_reader(self.sock.fileno(), self._accept)
        else:
            self._give_reserve()
            self._retry = self._loop.call_later(RETRY_S, self._resume)

    def _take_reserve(self, count: int) -> bool:
        try:
            while len(self._reserve) < count:
                self._reserve.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            return False
        return True

    def _give_reserve(self) -> None:
        for fd in self._reserve:
            os.close(fd)
        self._reserve.clear()


def bind(host: str, port: int, backlog: int, what: str = "") -> socket.socket:
    """A listening socket; a failure (address in use, not permitted) is the user's, one line naming
    `what` listens there ("" for the client listener)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as e:  # worded as asyncio's create_server words it
        sock.close()
        reason = (e.strerror or str(e)).lower()
        where = f"{what}: " if what else ""
        raise CannotListen(
            e.errno, f"{where}error while attempting to bind on address {(host, port)!r}: {reason}"
        ) from e
    except BaseException:
        sock.close()
        raise
    return sock
