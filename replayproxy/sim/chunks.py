"""Response bytes in vLLM's OpenAI wire format: SSE events for streams, one JSON body otherwise.

The per-request constant parts of a stream chunk are serialized once, so a content chunk costs one
`orjson.dumps` of its text plus a byte join; this keeps the sim far from being the bottleneck.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from replayproxy.sim.api import CHAT
from replayproxy.sim.sampler import OutputPlan

DONE = b"data: [DONE]\n\n"


def chunk_ranges(
    sent: int, available: int, done: bool, per_chunk: int, reasoning: int
) -> Iterator[tuple[int, int]]:
    """Token ranges to send now: whole chunks of `per_chunk`, a short one only at the end, and never
    one that mixes reasoning (tokens < `reasoning`) and content."""
    while sent < available and (done or available - sent >= per_chunk):
        end = min(sent + per_chunk, available)
        if sent < reasoning < end:
            end = reasoning
        yield sent, end
        sent = end


class Formatter:
    """Bytes of one request's answer; `prompt_tokens` and `cached_tokens` are fixed at construction."""

    def __init__(
        self,
        endpoint: str,
        rid: str,
        created: int,
        model: str,
        prompt_tokens: int,
        cached_tokens: int,
        reasoning_tokens: int,
        continuous_usage: bool,
        token_ids: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.rid = rid
        self.created = created
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.reasoning_tokens = reasoning_tokens if endpoint == CHAT else 0
        self.continuous_usage = continuous_usage
        self.token_ids = token_ids  # vLLM's `return_token_ids`: ids beside the text in every choice
        obj = "chat.completion.chunk" if endpoint == CHAT else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": model}
        self._head = b"data: " + orjson.dumps(head)[:-1] + b',"choices":['

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _event(self, choice: bytes, completion_tokens: int | None) -> bytes:
        tail = b"]}\n\n"
        if completion_tokens is not None:
            tail = b'],"usage":' + orjson.dumps(self.usage(completion_tokens)) + b"}\n\n"
        return self._head + choice + tail

    def role(self) -> bytes:
        """Chat's first chunk, as vLLM and OpenAI send it: the role and empty content."""
        choice = b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}'
        return self._event(choice, 0 if self.continuous_usage else None)

    def content(self, plan: OutputPlan, start: int, end: int) -> bytes:
        """The chunk carrying tokens [start, end); it carries the finish reason if end is the last."""
        text = orjson.dumps("".join(plan.pieces[start:end]))
        last = end == plan.length
        finish = orjson.dumps(plan.finish_reason) if last else b"null"
        stop = orjson.dumps(plan.stop_reason) if last else b"null"
        if self.endpoint == CHAT:
            if plan.tool_name:
                delta = _tool_call_delta(self.rid, plan.tool_name, text, start == 0)
            else:
                key = b'"reasoning_content":' if start < self.reasoning_tokens else b'"content":'
                delta = key + text
            choice = b'{"index":0,"delta":{' + delta + b'},"logprobs":null,"finish_reason":' + finish
            choice += b',"stop_reason":' + stop if last else b""
        else:
            choice = b'{"index":0,"text":' + text + b',"logprobs":null,"finish_reason":' + finish
            choice += b',"stop_reason":' + stop
        if self.token_ids:
            choice += b',"token_ids":' + orjson.dumps(plan.ids[start:end])
        choice += b"}"
        return self._event(choice, end if self.continuous_usage else None)

    def usage_event(self, completion_tokens: int) -> bytes:
        """The final `choices: []` chunk that `stream_options.include_usage` asks for."""
        return self._event(b"", completion_tokens)

    def body(self, plan: OutputPlan) -> bytes:
        """The whole non-streaming answer."""
        text = "".join(plan.pieces[self.reasoning_tokens :])
        choice: dict[str, Any] = {"index": 0}
        if self.endpoint == CHAT:
            reasoning = "".join(plan.pieces[: self.reasoning_tokens]) if self.reasoning_tokens else None
            calls = [_tool_call(self.rid, plan.tool_name, text)] if plan.tool_name else []
            choice["message"] = {
                "role": "assistant",
                "content": None if calls else text,
                "reasoning_content": reasoning,
                "tool_calls": calls,
            }
        else:
            choice["text"] = text
        choice.update(logprobs=None, finish_reason=plan.finish_reason, stop_reason=plan.stop_reason)
        if self.token_ids:
            choice["token_ids"] = list(plan.ids)
        obj = "chat.completion" if self.endpoint == CHAT else "text_completion"
        return orjson.dumps(
            {
                "id": self.rid,
                "object": obj,
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                "usage": self.usage(plan.length),
            }
        )


def _tool_call(rid: str, name: str, arguments: str) -> dict[str, Any]:
    """A tool call as vLLM and OpenAI write it: the arguments are a JSON text."""
    return {"id": f"call_{rid[-24:]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_call_delta(rid: str, name: str, arguments: bytes, first: bool) -> bytes:
    """A streamed tool call: the first delta carries id and name, later ones more argument text."""
    if first:
        call = orjson.dumps(_tool_call(rid, name, ""))[:-4]  # without the empty arguments and `}}`
        return b'"tool_calls":[{"index":0,' + call[1:] + arguments + b"}}]"
    return b'"tool_calls":[{"index":0,"function":{"arguments":' + arguments + b"}}]"


def chunk_count(length: int, per_chunk: int, reasoning: int) -> int:
    """How many content chunks `chunk_ranges` yields for a whole output of `length` tokens."""
    if 0 < reasoning < length:
        return -(-reasoning // per_chunk) + -(-(length - reasoning) // per_chunk)
    return -(-length // per_chunk)
