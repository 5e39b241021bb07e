"""The sim's HTTP face: aiohttp routes in vLLM's OpenAI-server shape over the engine.

`make_app(config)` builds the application (for in-process tests); `serving(config)` runs it on a
socket and yields the base URL (used by `python -m replayproxy.sim` and by other packages' tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from replayproxy.sim import api, variants
from replayproxy.sim.chunks import DONE, Formatter, chunk_count, chunk_ranges
from replayproxy.sim.clock import wall_ns, wall_s
from replayproxy.sim.config import SimConfig
from replayproxy.sim.engine import Engine, Seq
from replayproxy.sim.faults import FaultDrawer, Faults
from replayproxy.sim.metrics import CONTENT_TYPE, Metrics
from replayproxy.sim.prompts import Prompts, load
from replayproxy.sim.sampler import OutputPlan, Sampler
from replayproxy.sim.tasks import spawn
from replayproxy.sim.truth import TruthLog, TruthRecord

SIM_VERSION = "0.1.0-sim"
JSON = "application/json"
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
CLIENT_GONE = 499  # truth-log status of a request whose client disconnected (nginx's convention)


@dataclass(slots=True)
class Sim:
    """Everything one running sim owns; tests reach it as `app[SIM]`."""

    config: SimConfig
    engine: Engine
    metrics: Metrics
    sampler: Sampler
    faults: FaultDrawer
    prompts: Prompts
    truth: TruthLog | None = None
    variance: random.Random = field(default_factory=random.Random)  # batch_variance draws
    connections: dict[asyncio.Transport, bool] = field(default_factory=dict)  # open ones: busy?


SIM = web.AppKey("sim", Sim)


def make_app(config: SimConfig | None = None) -> web.Application:
    """The sim as an aiohttp application; the engine task and truth log live as long as the app runs."""
    config = config or SimConfig()
    metrics = Metrics(config.model)
    engine = Engine(config, metrics)
    metrics.engine = engine
    middlewares = [_require_api_key(config.api_key)] if config.api_key else []
    if config.close_after_stream or config.http_threads:
        middlewares.append(_connection_habits(config))
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
    prompts = load(config.tokenizer, config.chat_template or "")
    sampler = Sampler(config.mean_output_tokens, config.seed, config.output_seed, prompts.generation)
    app[SIM] = Sim(
        config, engine, metrics, sampler, FaultDrawer(config), prompts, variance=random.Random(config.seed)
    )
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/tokenize", _tokenize)
    if config.dialect == "llamacpp":
        app.router.add_get("/slots", _slots)
        app.router.add_post("/slots/{slot}", _slot_action)
    return app


def _require_api_key(key: str) -> Middleware:
    """vLLM's --api-key: every /v1 route needs `Authorization: Bearer <key>`, or it answers 401."""
    expected = f"Bearer {key}"

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1") and request.headers.get("Authorization") != expected:
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def _connection_habits(config: SimConfig) -> Middleware:
    """llama.cpp's server over HTTP/1.1: it closes the connection after each streamed response and
    drops keep-alive connections beyond its few HTTP threads, while every response says keep-alive."""

    @web.middleware
    async def habits(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        connections = request.app[SIM].connections
        if transport is None:
            return await handler(request)
        connections.pop(transport, None)  # to the end: the dict is in order of last use
        connections[transport] = True
        if config.http_threads:
            _drop_idle_beyond(connections, config.http_threads)
        try:
            resp = await handler(request)
            if config.close_after_stream and resp.content_type == "text/event-stream":
                await resp.write_eof()
                transport.close()
        finally:
            connections[transport] = False
        return resp

    return habits


def _drop_idle_beyond(connections: dict[asyncio.Transport, bool], threads: int) -> None:
    """Close idle connections, the least recently used first, until `threads` remain."""
    for transport in [t for t in connections if t.is_closing()]:
        del connections[transport]
    extra = len(connections) - threads
    for transport in [t for t, busy in connections.items() if not busy][: max(extra, 0)]:
        transport.close()
        del connections[transport]


@contextlib.asynccontextmanager
async def serving(config: SimConfig, shutdown_timeout: float = 2.0) -> AsyncIterator[str]:
    """Run the sim on (config.host, config.port) and yield its base URL (the real port if port is 0)."""
    runner = web.AppRunner(
        make_app(config),
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        keepalive_timeout=config.keepalive_timeout,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port, backlog=2048)
        await site.start()
        port = runner.addresses[0][1]
        host = f"[{config.host}]" if ":" in config.host else config.host
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    sim = app[SIM]
    sim.truth = TruthLog(sim.config.truth_log)
    task = spawn(sim.engine.run(), name="sim-engine")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    sim.truth.close()


async def _models(request: web.Request) -> web.Response:
    config = request.app[SIM].config
    card = {
        "id": config.model,
        "object": "model",
        "created": wall_s(),
        "owned_by": "replayproxy-sim",
        "root": _root(config),
        "parent": None,
        "max_model_len": config.max_model_len,
    }
    return web.Response(body=orjson.dumps({"object": "list", "data": [card]}), content_type=JSON)


def _root(config: SimConfig) -> str:
    """vLLM's `root`: the model path it serves; the sim's is the directory of its --tokenizer."""
    if not config.tokenizer:
        return config.model
    path = Path(config.tokenizer)
    return str((path if path.is_dir() else path.parent).resolve())


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _version(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps({"version": SIM_VERSION}), content_type=JSON)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[SIM].metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    """Like vLLM's endpoint: forget cached prefix blocks (those in use stay until released)."""
    request.app[SIM].engine.reset_prefix_cache()
    return web.Response()


async def _slots(request: web.Request) -> web.Response:
    """llama.cpp's `GET /slots`: one entry per parallel slot."""
    config = request.app[SIM].config
    per_slot = config.max_model_len
    slots = [
        {"id": i, "n_ctx": per_slot, "speculative": False, "is_processing": False}
        for i in range(config.slots)
    ]
    return web.Response(body=orjson.dumps(slots), content_type=JSON)


def _llama_error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"code": status, "message": message, "type": kind}}
    return web.Response(status=status, body=orjson.dumps(body), content_type=JSON)


async def _slot_action(request: web.Request) -> web.Response:
    """llama.cpp's `POST /slots/N?action=erase`: 501 unless started with --slot-save-path, as
    build 11434 answers. The sim's prefix cache is shared by its slots, so an erase forgets all of
    it (erasing every slot, as a cold start does, leaves the same empty cache on a real server)."""
    sim = request.app[SIM]
    if not sim.config.slot_save_path:
        message = "This server does not support slots action. Start it with `--slot-save-path`"
        return _llama_error(501, message, "not_supported_error")
    if not request.match_info["slot"].isdigit():
        return _llama_error(400, "Invalid slot ID", "invalid_request_error")
    if request.query.get("action") != "erase":
        return _llama_error(400, "Invalid action", "invalid_request_error")
    erased = sim.engine.reset_prefix_cache() * sim.config.block_size
    answer = {"id_slot": int(request.match_info["slot"]), "n_erased": erased}
    return web.Response(body=orjson.dumps(answer), content_type=JSON)


async def _tokenize(request: web.Request) -> web.Response:
    """vLLM's `POST /tokenize` answer: count, max_model_len and the token ids."""
    sim = request.app[SIM]
    sim.metrics.tokenize_calls += 1
    try:
        ids = api.tokenize(await request.read(), sim.config.model, sim.prompts)
    except api.ApiError as e:
        return web.Response(status=e.status, body=e.body(), content_type=JSON)
    answer = {"count": len(ids), "max_model_len": sim.config.max_model_len, "tokens": ids, "token_strs": None}
    return web.Response(body=orjson.dumps(answer), content_type=JSON)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, api.CHAT)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, api.COMPLETION)


async def _generate(request: web.Request, endpoint: str) -> web.StreamResponse:
    sim = request.app[SIM]
    config = sim.config
    record = TruthRecord(endpoint=endpoint, arrival_ns=wall_ns())
    try:
        try:
            req = api.parse(endpoint, await request.read(), config.model, config.max_model_len, sim.prompts)
        except api.ApiError as e:
            return await _send_error(request, record, e)
        if sim.faults.echo_reject():
            record.fault = "echo_400"
            return await _send_error(request, record, api.echoed_rejection(await request.read()))
        plan, prompt_ids = variants.answer_plan(sim.sampler, config, req, sim.engine.busy, sim.variance)
        record.stream, record.prompt_tokens = req.stream, len(prompt_ids)
        reasoning = _reasoning_tokens(config, endpoint, plan)
        events = (endpoint == api.CHAT) + chunk_count(plan.length, config.tokens_per_chunk, reasoning)
        usage_event = req.include_usage and not (config.dialect == "llamacpp" and endpoint != api.CHAT)
        faults = sim.faults.draw(events + usage_event + 1 if req.stream else 1)
        record.fault = faults.name
        if faults.error is not None:
            return await _send_error(request, record, faults.error)
        record.id = f"{'chatcmpl' if endpoint == api.CHAT else 'cmpl'}-{uuid.uuid4().hex}"
        return await _Answer(request, sim, req, plan, prompt_ids, record, faults).run()
    finally:
        if sim.truth is not None:
            sim.truth.write(record)


def _reasoning_tokens(config: SimConfig, endpoint: str, plan: OutputPlan) -> int:
    """Chat answers of free text open with reasoning; JSON and tool calls are all content."""
    return config.reasoning_tokens if endpoint == api.CHAT and not plan.shaped else 0


async def _send_error(request: web.Request, record: TruthRecord, error: api.ApiError) -> web.StreamResponse:
    record.status = error.status
    resp = web.StreamResponse(status=error.status, headers={"Content-Type": JSON})
    body = error.body()
    resp.content_length = len(body)
    await resp.prepare(request)
    await resp.write(body)
    record.chunk_ns.append(wall_ns())
    record.kinds += "e"
    return resp


class _Answer:
    """Streams (or returns at the end) one request's tokens as the engine produces them."""

    def __init__(
        self,
        request: web.Request,
        sim: Sim,
        req: api.GenRequest,
        plan: OutputPlan,
        prompt_ids: list[int],
        record: TruthRecord,
        faults: Faults,
    ) -> None:
        self.request = request
        self.sim = sim
        self.req = req
        self.plan = plan
        self.prompt_ids = prompt_ids
        self.record = record
        self.faults = faults
        self.resp = web.StreamResponse(headers=SSE_HEADERS if req.stream else {"Content-Type": JSON})
        self.wake = asyncio.Event()

    async def run(self) -> web.StreamResponse:
        seq = self.sim.engine.add(
            self.prompt_ids,
            self.plan.length,
            self._notify_stream if self.req.stream else self._notify_done,
            self.plan.ids,
        )
        try:
            await (self._stream(seq) if self.req.stream else self._whole(seq))
        except _Reset:
            pass
        except ConnectionError:
            self.record.status = CLIENT_GONE
        finally:
            self.sim.engine.abort(seq)  # no-op once finished
            self.record.completion_tokens = seq.generated
            self.record.cached_tokens = seq.cached_tokens
            if seq.generated == self.plan.length:
                self.record.finish_reason = self.plan.finish_reason
        return self.resp

    def _notify_stream(self, seq: Seq) -> None:
        self.wake.set()

    def _notify_done(self, seq: Seq) -> None:
        if seq.done:
            self.wake.set()

    def _formatter(self, seq: Seq) -> Formatter:
        config = self.sim.config
        return Formatter(
            self.req.endpoint,
            self.record.id or "",
            wall_s(),
            config.model,
            seq.prompt_len,
            seq.cached_tokens,
            _reasoning_tokens(config, self.req.endpoint, self.plan),
            self.req.continuous_usage,
            self.req.return_token_ids,
            config.dialect,
            self.req.include_usage,
        )

    async def _whole(self, seq: Seq) -> None:
        """Like vLLM's JSONResponse: nothing is sent until the whole body is ready."""
        await self.wake.wait()
        body = self._formatter(seq).body(self.plan)
        await self._delay_first_byte()
        self.resp.content_length = len(body)
        await self._write([(body, "b")])

    async def _delay_first_byte(self) -> None:
        if self.faults.first_byte_delay_s:
            await asyncio.sleep(self.faults.first_byte_delay_s)

    async def _stream(self, seq: Seq) -> None:
        """Headers at once, then each step's tokens as SSE events (role chunk with the first token)."""
        config = self.sim.config
        await self._delay_first_byte()
        await self.resp.prepare(self.request)
        fmt: Formatter | None = None
        sent = 0
        while True:
            await self.wake.wait()
            self.wake.clear()
            generated, done = seq.generated, seq.done
            events: list[tuple[bytes, str]] = []
            if fmt is None:
                fmt = self._formatter(seq)
                if self.req.endpoint == api.CHAT:
                    events.append((fmt.role(), "r"))
            reasoning = fmt.reasoning_tokens
            for start, end in chunk_ranges(sent, generated, done, config.tokens_per_chunk, reasoning):
                events.append((fmt.content(self.plan, start, end), "R" if start < reasoning else "c"))
                sent = end
            if done:
                usage = fmt.usage_event(generated) if self.req.include_usage else b""
                if usage:
                    events.append((usage, "u"))
                events.append((DONE, "d"))
            if events:
                await self._write(events)
            if done:
                return

    async def _write(self, events: list[tuple[bytes, str]]) -> None:
        """Write events, stamping each in the truth record; faults and split writes go event by event."""
        record, faults = self.record, self.faults
        split = self.sim.config.split_writes
        if not (split or faults.reset_after is not None or faults.stall_after is not None):
            await self._send(b"".join(data for data, _ in events))
            now = wall_ns()
            record.chunk_ns.extend([now] * len(events))
            record.kinds += "".join(kind for _, kind in events)
            return
        for data, kind in events:
            if len(record.kinds) == faults.stall_after:
                await asyncio.sleep(faults.stall_s)
            if len(record.kinds) == faults.reset_after:
                self._reset()
            if split:
                middle = len(data) // 2
                await self._send(data[:middle])
                await asyncio.sleep(0)
                data = data[middle:]
            await self._send(data)
            record.chunk_ns.append(wall_ns())
            record.kinds += kind

    async def _send(self, data: bytes) -> None:
        if not self.resp.prepared:
            await self.resp.prepare(self.request)
        await self.resp.write(data)

    def _reset(self) -> None:
        """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed upstream would."""
        transport = self.request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        raise _Reset


class _Reset(Exception):
    """Raised after an injected connection reset, to stop answering."""
