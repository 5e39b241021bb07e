"""From a capture to a `RequestShape`: runs in the recorder process, never on the forwarding path.

Token counts come from the upstream's `usage`, else from llama.cpp's `timings` (which it sends
unasked), and `usage_source` says which; without either, a stream's content chunks are counted and
the count is marked estimated. Timings are the proxy's own view: TTFT is request arrival to
the first chunk carrying generated content (DESIGN.md, measurement contract), E2E is arrival to
the end of the body or to the client's cancel. Chat turns are linked to the reply they continue
and to the replies they join (proxy.links, proxy.linker) when a `SessionLinker` is given.
"""

from __future__ import annotations

from typing import Any

import orjson

from replayproxy import shape
from replayproxy.proxy.linker import SessionLinker
from replayproxy.proxy.links import Conversation, Reply, conversation, reply_ids
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.prompt import PromptHasher, render_chat, render_completion
from replayproxy.proxy.stream_scan import StreamScan
from replayproxy.shape import (
    UNKNOWN,
    ErrorClass,
    RequestShape,
    ShapeFields,
    UsageSource,
    keep_sampling,
    role_letters,
)
from replayproxy.sse import Usage, parse_timings, parse_usage


def build_shape(
    cap: Capture, hasher: PromptHasher, origin_ns: int, linker: SessionLinker | None = None
) -> RequestShape:
    """The shape of one exchange; `origin_ns` is the monotonic time of the trace's offset 0."""
    fields: ShapeFields = {
        "offset_ns": cap.arrival_ns - origin_ns,
        "endpoint": cap.endpoint,
        "method": cap.method,
        "status": cap.status,
        "error": _error_class(cap),
        "request_bytes": cap.request_bytes,
        "response_bytes": cap.response_bytes,
        "e2e_ns": cap.end_ns - cap.arrival_ns if cap.end_ns >= 0 else UNKNOWN,
        "stream": cap.event_stream,
    }
    body = _request_json(cap)
    context: Conversation | None = None
    if body is not None:
        fields.update(_request_fields(cap.endpoint, body, hasher))
        if cap.endpoint == "chat" and linker is not None:
            messages = body.get("messages")
            context = conversation(messages if isinstance(messages, list) else [], hasher.key)
    reply = Reply() if context is not None and cap.status == 200 else None
    if cap.event_stream:
        fields.update(_stream_fields(cap, fields["error"], reply))
    else:
        fields.update(_body_fields(cap, reply))
    if context is not None and linker is not None:
        fields.update(_link_fields(cap, context, reply, hasher.key, linker))
    if cap.endpoint == "embeddings" and fields.get("output_tokens", UNKNOWN) == UNKNOWN and cap.status == 200:
        fields["output_tokens"] = 0
    return RequestShape(**fields)


def _error_class(cap: Capture) -> ErrorClass:
    return cap.error or shape.http_error(cap.status)


def _request_json(cap: Capture) -> dict[str, Any] | None:
    if cap.endpoint == "other" or cap.body_truncated or not cap.request_body:
        return None
    if isinstance(cap.request_json, dict):  # parsed already, by usage injection
        return cap.request_json
    return _json_object(cap.request_body)


def _json_object(parts: list[bytes]) -> dict[str, Any] | None:
    """The JSON object the captured bytes hold, or None when they hold anything else."""
    try:
        body = orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _request_fields(endpoint: str, body: dict[str, Any], hasher: PromptHasher) -> ShapeFields:
    model = body.get("model")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    fields: ShapeFields = {
        "model": model if isinstance(model, str) else "",
        "stream": body.get("stream") is True,
        "max_tokens": max_tokens
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool)
        else UNKNOWN,
        "sampling": keep_sampling(body),
        "has_tools": bool(body.get("tools") or body.get("functions")),
        "has_response_format": bool(body.get("response_format")),
    }
    if endpoint == "chat":
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        fields["roles"] = role_letters([m.get("role") if isinstance(m, dict) else None for m in messages])
        fields["prefix_hashes"], fields["prefix_units"] = hasher.prefix(render_chat(body))
    elif endpoint == "completions":
        fields["prefix_hashes"], fields["prefix_units"] = hasher.prefix(render_completion(body))
    return fields


def _link_fields(
    cap: Capture, context: Conversation, reply: Reply | None, key: bytes, linker: SessionLinker
) -> ShapeFields:
    """Session, turn and think time; a reply that was cut or failed cannot be continued as sent."""
    whole = reply is not None and not cap.response_truncated and not cap.error
    chat, content = reply_ids(context, reply, key) if whole and reply is not None else (0, 0)
    link = linker.link(context, chat, content, cap.arrival_ns, cap.end_ns)
    return {
        "session": link.session,
        "turn": link.turn,
        "think_ns": link.think_ns,
        "chat_id": chat,
        "parent_id": link.parent_id,
        "tool_chars": link.tool_chars,
        "join_ids": link.join_ids,
    }


def _stream_fields(cap: Capture, error: ErrorClass, reply: Reply | None) -> ShapeFields:
    scan = StreamScan(cap.pieces, cap.piece_ns, reply)
    fields = _usage_fields(scan.usage, scan.timings)
    if scan.content_ns:
        fields["ttft_ns"] = scan.content_ns[0] - cap.arrival_ns
        fields["chunk_gaps_us"] = scan.gaps_us()
    if fields.get("output_tokens", UNKNOWN) == UNKNOWN and not cap.response_truncated:
        fields["output_tokens"] = len(scan.content_ns)
        fields["output_estimated"] = True
    if scan.bad and not error:
        bad: ErrorClass = "bad_stream"  # annotated so mypy checks the name against the set
        fields["error"] = bad
    return fields


def _body_fields(cap: Capture, reply: Reply | None) -> ShapeFields:
    fields: ShapeFields = {}
    if cap.piece_ns and 200 <= cap.status < 300:
        fields["ttft_ns"] = cap.piece_ns[0] - cap.arrival_ns
    if cap.endpoint == "other" or cap.response_truncated or not cap.pieces:
        return fields
    body = _json_object(cap.pieces)
    if body is not None:
        fields.update(_usage_fields(parse_usage(body.get("usage")), parse_timings(body.get("timings"))))
        if reply is not None:
            reply.chunk(body)
    return fields


def _usage_fields(usage: Usage | None, timings: Usage | None) -> ShapeFields:
    source: UsageSource = "usage" if usage is not None else "timings"
    counts = usage if usage is not None else timings
    if counts is None:
        return {}
    return {
        "input_tokens": counts.prompt_tokens,
        "output_tokens": counts.completion_tokens,
        "cached_tokens": counts.cached_tokens,
        "usage_source": source,
    }
