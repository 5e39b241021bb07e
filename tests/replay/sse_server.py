"""A tiny raw-asyncio HTTP/1.1 server for replay client tests: scripted chunked SSE answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

from replayproxy.sim.thread import serving_in_thread

Handler = Callable[[bytes, asyncio.StreamWriter], "asyncio.Future[None] | object"]

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse_answer(events: int = 3, tokens: bool = True) -> bytes:
    parts = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n']
    for i in range(events):
        usage = f',"usage":{{"prompt_tokens":5,"completion_tokens":{i + 1}}}' if tokens else ""
        parts.append(f'data: {{"choices":[{{"index":0,"delta":{{"content":"w{i}"}}}}]{usage}}}\n\n'.encode())
    parts.append(b"data: [DONE]\n\n")
    return SSE_HEAD + b"".join(chunk(p) for p in parts) + b"0\r\n\r\n"


class Server:
    """Reads one request at a time per connection and lets `respond` answer it."""

    def __init__(
        self, respond: Callable[[bytes, asyncio.StreamWriter, int], object], keep: bool = True
    ) -> None:
        self.respond = respond
        self.keep = keep  # keep every request's bytes in `requests` (else only their heads)
        self.requests: list[bytes] = []
        self.connections = 0
        self.url = ""
        self.tasks: set[asyncio.Task[None]] = set()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection = self.connections
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)  # type: ignore[arg-type]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body if self.keep else head)
                outcome = self.respond(head + body, writer, connection)
                if asyncio.iscoroutine(outcome):
                    await outcome
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(
    respond: Callable[[bytes, asyncio.StreamWriter, int], object], keep: bool = True
) -> AsyncIterator[Server]:
    server = Server(respond, keep)
    listener = await asyncio.start_server(server._client, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        listener.close()
        for task in list(server.tasks):
            task.cancel()
        await asyncio.gather(*server.tasks, return_exceptions=True)
        await listener.wait_closed()


@contextlib.contextmanager
def in_thread(
    respond: Callable[[bytes, asyncio.StreamWriter, int], object], keep: bool = True
) -> Iterator[Server]:
    """`serving(respond)` on its own event loop in a thread, for tests that run a replayer process."""
    with serving_in_thread(lambda: serving(respond, keep)) as server:
        yield server
