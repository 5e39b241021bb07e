"""One request, one answer: POST a body, read the whole JSON reply, keep what the check compares.

Non-streaming on purpose: every engine puts `usage` and `finish_reason` in the final body, so the
answer is read the same way everywhere. Failures map to the trace's error classes; an error's
message keeps the status and the engine's error type, never request or answer text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from replayproxy import clock, sse
from replayproxy.shape import ErrorClass, http_error

UNKNOWN = -1


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # the JSON text the engine sent


@dataclass(frozen=True, slots=True)
class Answer:
    status: int = 0
    error: ErrorClass = ""
    error_message: str = ""
    e2e_ns: int = UNKNOWN
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = ""
    prompt_tokens: int = UNKNOWN
    completion_tokens: int = UNKNOWN

    @property
    def ok(self) -> bool:
        return not self.error


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    timeout_s: float,
) -> Answer:
    data = orjson.dumps(body)
    start = clock.now_ns()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=data, headers=headers) as resp:
                raw = await resp.read()
                status = resp.status
    except TimeoutError:
        return Answer(
            error="timeout", error_message=f"no answer in {timeout_s:g} s", e2e_ns=clock.now_ns() - start
        )
    except aiohttp.ClientConnectorError as e:
        return Answer(error="connect", error_message=type(e).__name__, e2e_ns=clock.now_ns() - start)
    except (aiohttp.ClientError, ConnectionError) as e:
        return Answer(error="reset", error_message=type(e).__name__, e2e_ns=clock.now_ns() - start)
    e2e_ns = clock.now_ns() - start
    if status != 200:
        kind: ErrorClass = http_error(status) or "other"
        error_type = sse.error_kind(raw)
        return Answer(status, kind, f"HTTP {status} {error_type}" if error_type else f"HTTP {status}", e2e_ns)
    try:
        return parse_answer(orjson.loads(raw), status, e2e_ns)
    except (orjson.JSONDecodeError, ValueError) as e:
        return Answer(status, "bad_stream", f"unreadable answer: {_reason(e)}", e2e_ns)


def parse_answer(answer: Any, status: int, e2e_ns: int) -> Answer:
    """The fields of an OpenAI chat or completion answer; raises ValueError when they are missing."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("no choices")
    choice = choices[0]
    message = choice.get("message")
    if isinstance(message, dict):
        text = message.get("content") or ""
        calls = tuple(_tool_call(c) for c in message.get("tool_calls") or ())
    else:
        text, calls = choice.get("text") or "", ()
    if not isinstance(text, str):
        raise ValueError("content is not a string")
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    return Answer(
        status=status,
        e2e_ns=e2e_ns,
        text=text,
        tool_calls=calls,
        finish_reason=str(choice.get("finish_reason") or ""),
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
    )


def _tool_call(call: Any) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return ToolCall("", "")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):  # some gateways send the arguments as an object
        arguments = orjson.dumps(arguments).decode() if arguments is not None else ""
    return ToolCall(str(function.get("name") or ""), arguments)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else UNKNOWN


def _reason(e: Exception) -> str:
    """Our own reason, or the decoder's class: a decoder's message can quote the bytes it choked on."""
    return type(e).__name__ if isinstance(e, orjson.JSONDecodeError) else str(e)[:80]
