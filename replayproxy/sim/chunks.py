"""Response bytes in an engine's OpenAI wire format: SSE events for streams, one JSON body otherwise.

vLLM's by default; a `dialect` gives another engine's differences a proxy must keep byte for byte
(docs/sim.md, "Dialects"): SGLang and TGI put `"usage":null` in every chunk, OpenAI only once usage
is asked for; TGI and OpenAI carry a `system_fingerprint`; TensorRT-LLM leaves null members out;
llama.cpp writes `timings` at the end of its finish chunk, moved into the usage event when usage
is asked for (chat), and always puts usage in the finish chunk of a completion, with no usage event.
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
        dialect: str = "vllm",
        include_usage: bool = False,
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
        self.dialect = dialect
        self.include_usage = include_usage
        obj = "chat.completion.chunk" if endpoint == CHAT else "text_completion"
        head = {"id": rid, "object": obj, "created": created, "model": model}
        self._head = b"data: " + orjson.dumps(head)[:-1] + b',"choices":['
        self._logprobs = b"" if dialect in ("trtllm", "llamacpp") else b',"logprobs":null'
        fingerprint = _FINGERPRINTS.get(dialect)
        self._after = b',"system_fingerprint":' + orjson.dumps(fingerprint) if fingerprint else b""
        null_usage = dialect in ("sglang", "tgi") or (dialect == "openai" and include_usage)
        self._null_usage = b',"usage":null' if null_usage else b""
        # llama.cpp's completions report usage in the finish chunk, asked or not, and send no usage event
        self._usage_in_finish = dialect == "llamacpp" and endpoint != CHAT

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def _event(self, choice: bytes, completion_tokens: int | None, timings: int | None = None) -> bytes:
        """One chunk; `completion_tokens` puts a usage in it, `timings` llama.cpp's (generated tokens)."""
        tail = b"]" + self._after
        if completion_tokens is not None:
            tail += b',"usage":' + orjson.dumps(self.usage(completion_tokens))
        else:
            tail += self._null_usage
        if timings is not None:
            tail += b',"timings":' + orjson.dumps(self._timings(timings))
        return self._head + choice + tail + b"}\n\n"

    def _timings(self, completion_tokens: int) -> dict[str, Any]:
        """llama.cpp's counts: prompt tokens evaluated, reused from its cache, and generated."""
        return {
            "cache_n": self.cached_tokens,
            "prompt_n": self.prompt_tokens - self.cached_tokens,
            "prompt_ms": 1.5,
            "predicted_n": completion_tokens,
            "predicted_ms": 2.25,
        }

    def role(self) -> bytes:
        """Chat's first chunk, as vLLM and OpenAI send it: the role and empty content (null: llama.cpp)."""
        content = b"null" if self.dialect == "llamacpp" else b'""'
        choice = b'{"index":0,"delta":{"role":"assistant","content":%b}%b,"finish_reason":null}' % (
            content,
            self._logprobs,
        )
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
            choice = b'{"index":0,"delta":{' + delta + b"}" + self._logprobs + b',"finish_reason":' + finish
            choice += b',"stop_reason":' + stop if last else b""
        else:
            choice = b'{"index":0,"text":' + text + self._logprobs + b',"finish_reason":' + finish
            choice += b',"stop_reason":' + stop
        if self.token_ids:
            choice += b',"token_ids":' + orjson.dumps(plan.ids[start:end])
        choice += b"}"
        usage = end if self.continuous_usage or (last and self._usage_in_finish) else None
        moved = self.include_usage and not self._usage_in_finish  # to the usage event
        timings = end if last and self.dialect == "llamacpp" and not moved else None
        return self._event(choice, usage, timings)

    def usage_event(self, completion_tokens: int) -> bytes:
        """The final `choices: []` chunk that `stream_options.include_usage` asks for (b"": none)."""
        if self._usage_in_finish:
            return b""
        return self._event(b"", completion_tokens, completion_tokens if self.dialect == "llamacpp" else None)

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
        answer = {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(plan.length),
        }
        if self.dialect == "llamacpp":
            answer["timings"] = self._timings(plan.length)
        elif self.dialect in _FINGERPRINTS:
            answer["system_fingerprint"] = _FINGERPRINTS[self.dialect]
        return orjson.dumps(answer)


_FINGERPRINTS = {"tgi": "3.0.1-native", "openai": "fp_sim"}


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
