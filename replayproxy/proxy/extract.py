"""From a capture to a `RequestShape`: runs on the recorder thread, never on the forwarding path.

Token counts come from the upstream's `usage`; without it, a stream's content chunks are counted
and the count is marked estimated. Timings are the proxy's own view: TTFT is request arrival to
the first chunk carrying generated content (DESIGN.md, measurement contract), E2E is arrival to
the end of the body or to the client's cancel.
"""

from __future__ import annotations

from typing import Any

import orjson

from replayproxy.proxy.observe import Capture
from replayproxy.proxy.prompt import PromptHasher, render_chat, render_completion
from replayproxy.shape import UNKNOWN, RequestShape, keep_sampling, role_letters
from replayproxy.sse import CONTENT, ERROR, SSEDecoder, StreamClassifier, Usage, parse_usage

_QUOTE = 0x22


def build_shape(cap: Capture, hasher: PromptHasher, origin_ns: int) -> RequestShape:
    """The shape of one exchange; `origin_ns` is the monotonic time of the trace's offset 0."""
    fields: dict[str, Any] = {
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
    if body is not None:
        fields.update(_request_fields(cap.endpoint, body, hasher))
    if cap.event_stream:
        fields.update(_stream_fields(cap, fields["error"]))
    else:
        fields.update(_body_fields(cap))
    if cap.endpoint == "embeddings" and fields.get("output_tokens", UNKNOWN) == UNKNOWN and cap.status == 200:
        fields["output_tokens"] = 0
    return RequestShape(**fields)


def _error_class(cap: Capture) -> str:
    if cap.error:
        return cap.error
    if cap.status >= 500:
        return "http_5xx"
    if cap.status >= 400:
        return "http_4xx"
    return ""


def _request_json(cap: Capture) -> dict[str, Any] | None:
    if cap.endpoint == "other" or cap.body_truncated or not cap.request_body:
        return None
    return _json_object(cap.request_body)


def _json_object(parts: list[bytes]) -> dict[str, Any] | None:
    """The JSON object the captured bytes hold, or None when they hold anything else."""
    try:
        body = orjson.loads(b"".join(parts))
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _request_fields(endpoint: str, body: dict[str, Any], hasher: PromptHasher) -> dict[str, Any]:
    model = body.get("model")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    fields: dict[str, Any] = {
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
        fields["session"] = hasher.session(messages)
        fields["turn"] = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    elif endpoint == "completions":
        fields["prefix_hashes"], fields["prefix_units"] = hasher.prefix(render_completion(body))
    return fields


def _stream_fields(cap: Capture, error: str) -> dict[str, Any]:
    decoder = SSEDecoder()
    classifier = StreamClassifier()
    usage: Usage | None = None
    content_ns: list[int] = []
    bad = False
    boundary = True  # the decoder holds nothing: a lone `data:` event can skip it
    prefix, suffix = b"\0", b""  # the first envelope, tested inline (plain_event's test, no call)
    for piece, at_ns in zip(cap.pieces, cap.piece_ns, strict=True):
        if boundary and (
            (
                piece.startswith(prefix)
                and piece.endswith(suffix)
                and len(piece) > len(prefix) + len(suffix)
                and piece[len(prefix)] != _QUOTE
                and piece.count(b"\n") == 2
            )
            or classifier.plain_event(piece)
        ):
            content_ns.append(at_ns)
            continue
        if boundary and piece.startswith(b"data: ") and piece.endswith(b"\n\n") and piece.count(b"\n") == 2:
            datas = [piece[6:-2]]  # one event per read, as engines write them (the decoder's own fast path)
        else:
            datas = [event.data for event in decoder.feed(piece)]
            boundary = piece.endswith(b"\n\n") and b"\r" not in piece
        for data in datas:
            info = classifier.classify(data)
            if info.kind == CONTENT:
                content_ns.append(at_ns)
            elif info.kind == ERROR:
                bad = True
            if info.usage is not None:
                usage = info.usage
        if suffix == b"" and classifier.event_templates:
            prefix, suffix = classifier.event_templates[0]
    fields = _usage_fields(usage)
    if content_ns:
        fields["ttft_ns"] = content_ns[0] - cap.arrival_ns
        fields["chunk_gaps_us"] = tuple(
            (b - a) // 1000 for a, b in zip(content_ns, content_ns[1:], strict=False)
        )
    if fields.get("output_tokens", UNKNOWN) == UNKNOWN and not cap.response_truncated:
        fields["output_tokens"] = len(content_ns)
        fields["output_estimated"] = True
    if bad and not error:
        fields["error"] = "bad_stream"
    return fields


def _body_fields(cap: Capture) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if cap.piece_ns and 200 <= cap.status < 300:
        fields["ttft_ns"] = cap.piece_ns[0] - cap.arrival_ns
    if cap.endpoint == "other" or cap.response_truncated or not cap.pieces:
        return fields
    body = _json_object(cap.pieces)
    if body is not None:
        fields.update(_usage_fields(parse_usage(body.get("usage"))))
    return fields


def _usage_fields(usage: Usage | None) -> dict[str, Any]:
    if usage is None:
        return {}
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }
