"""The target's tokenizer behind one seam: token ids of chat messages and of text, as the target counts them.

Exact prompts need the target's own tokenizer and chat template, so counts come from one of:
the engine's tokenize endpoint (vLLM and SGLang `POST /tokenize`, which applies the served chat
template to `messages`; llama.cpp `/apply-template` then `/tokenize`; TGI `/chat_tokenize` and
`/tokenize`), or a local Hugging Face `tokenizer.json` with its chat template (`--tokenizer PATH`,
extra `replayproxy[tokenizers]`; nothing is downloaded). Calls take batches so an HTTP source can
overlap them; counting is `len(encode...)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from replayproxy.errors import UserError

if TYPE_CHECKING:  # aiohttp is imported where a request is made: the preparer process imports
    import aiohttp  # this module (through replay.prompt_parts) and never makes one

Message = Mapping[str, Any]  # an OpenAI chat message: {"role": ..., "content": ...}
CONCURRENCY = 32  # tokenize calls in flight against an engine (they are short)


class TokenizerError(UserError, ValueError):
    """A tokenizer could not be loaded or did not answer; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Chat:
    """One chat prompt to tokenize: its messages and the tools it declares (None: no tools)."""

    messages: Sequence[Message]
    tools: Sequence[Mapping[str, Any]] | None = None


class Tokenizer(Protocol):
    """Token ids as the target sees them: chats with its chat template and generation prompt applied."""

    name: str  # where the ids come from, e.g. "vllm /tokenize" or "tokenizer.json"

    async def encode_chat(self, chats: Sequence[Chat]) -> list[list[int]]: ...

    async def encode_text(self, texts: Sequence[str], special: bool = True) -> list[list[int]]:
        """`special`: add the special tokens (e.g. BOS) the target adds to a text prompt."""
        ...


async def count_chat(tokenizer: Tokenizer, chats: Sequence[Chat]) -> list[int]:
    return [len(ids) for ids in await tokenizer.encode_chat(chats)]


async def count_text(tokenizer: Tokenizer, texts: Sequence[str], special: bool = True) -> list[int]:
    return [len(ids) for ids in await tokenizer.encode_text(texts, special)]


def chat_messages(chat: Chat) -> list[dict[str, Any]]:
    return [dict(m) for m in chat.messages]


# ---------------------------------------------------------------------------------- engine endpoints


@dataclass(slots=True)
class _Endpoint:
    session: aiohttp.ClientSession
    url: str
    headers: Mapping[str, str]
    calls: int = 0  # requests made: during a run, load the engine carries beside the replayed traffic

    async def post(self, path: str, body: dict[str, Any]) -> Any:
        import aiohttp

        from replayproxy.replay import probe_http

        self.calls += 1
        headers = {"Content-Type": "application/json", **self.headers}
        try:
            status, raw = await probe_http.request(
                self.session, "POST", f"{self.url}{path}", headers, orjson.dumps(body)
            )
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TokenizerError(f"POST {path}: {type(e).__name__}: {e}") from e
        if status != 200:
            raise TokenizerError(
                f"POST {path} answered HTTP {status}: {raw[:160].decode('utf-8', 'replace')}"
            )
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise TokenizerError(f"POST {path} answered something that is not JSON") from e


async def _gather(calls: Sequence[Any]) -> list[list[int]]:
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Any) -> list[int]:
        async with limit:
            return await call  # type: ignore[no-any-return]

    answers = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers  # type: ignore[return-value]


def calls_made(tokenizer: Tokenizer) -> int:
    """HTTP requests `tokenizer` made to the engine (0 for a local one)."""
    endpoint = getattr(tokenizer, "_endpoint", None)
    return endpoint.calls if isinstance(endpoint, _Endpoint) else 0


def _ids(value: Any, where: str) -> list[int]:
    if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    raise TokenizerError(f"{where}: no token ids in the answer")


class VllmTokenizer:
    """vLLM's (and SGLang's) `POST /tokenize`: `messages` get the served chat template applied."""

    name = "vllm /tokenize"

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, headers: Mapping[str, str]):
        self._endpoint = _Endpoint(session, url, headers)
        self._model = model

    async def _chat(self, chat: Chat) -> list[int]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": chat_messages(chat),
            "add_generation_prompt": True,
        }
        if chat.tools:
            body["tools"] = [dict(t) for t in chat.tools]
        return _ids((await self._endpoint.post("/tokenize", body)).get("tokens"), "/tokenize")

    async def _text(self, text: str, special: bool) -> list[int]:
        body = {"model": self._model, "prompt": text, "add_special_tokens": special}
        return _ids((await self._endpoint.post("/tokenize", body)).get("tokens"), "/tokenize")

    async def encode_chat(self, chats: Sequence[Chat]) -> list[list[int]]:
        return await _gather([self._chat(c) for c in chats])

    async def encode_text(self, texts: Sequence[str], special: bool = True) -> list[list[int]]:
        return await _gather([self._text(t, special) for t in texts])


class LlamaCppTokenizer:
    """llama.cpp's server: `/apply-template` renders the served template, `/tokenize` counts it."""

    name = "llama.cpp /apply-template + /tokenize"

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, headers: Mapping[str, str]):
        self._endpoint = _Endpoint(session, url, headers)

    async def _tokenize(self, text: str, special: bool) -> list[int]:
        body = {"content": text, "add_special": special, "parse_special": True}
        answer = await self._endpoint.post("/tokenize", body)
        return _ids(answer.get("tokens") if isinstance(answer, dict) else None, "/tokenize")

    async def _chat(self, chat: Chat) -> list[int]:
        body: dict[str, Any] = {"messages": chat_messages(chat)}
        if chat.tools:
            body["tools"] = [dict(t) for t in chat.tools]
        answer = await self._endpoint.post("/apply-template", body)
        prompt = answer.get("prompt") if isinstance(answer, dict) else None
        if not isinstance(prompt, str):
            raise TokenizerError("/apply-template: no prompt in the answer")
        return await self._tokenize(prompt, True)  # the server tokenizes chat prompts with specials

    async def encode_chat(self, chats: Sequence[Chat]) -> list[list[int]]:
        return await _gather([self._chat(c) for c in chats])

    async def encode_text(self, texts: Sequence[str], special: bool = True) -> list[list[int]]:
        return await _gather([self._tokenize(t, special) for t in texts])


class TgiTokenizer:
    """Text Generation Inference: `/chat_tokenize` (template applied) and `/tokenize`."""

    name = "tgi /chat_tokenize"

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, headers: Mapping[str, str]):
        self._endpoint = _Endpoint(session, url, headers)
        self._model = model

    @staticmethod
    def _token_list(answer: Any, where: str) -> list[int]:
        if isinstance(answer, list) and all(
            isinstance(t, dict) and isinstance(t.get("id"), int) for t in answer
        ):
            return [t["id"] for t in answer]
        raise TokenizerError(f"{where}: no token list in the answer")

    async def _chat(self, chat: Chat) -> list[int]:
        body: dict[str, Any] = {"model": self._model, "messages": chat_messages(chat)}
        if chat.tools:
            body["tools"] = [dict(t) for t in chat.tools]
        answer = await self._endpoint.post("/chat_tokenize", body)
        tokens = answer.get("tokenize_response") if isinstance(answer, dict) else None
        return self._token_list(tokens, "/chat_tokenize")

    async def _text(self, text: str, special: bool) -> list[int]:
        answer = await self._endpoint.post("/tokenize", {"inputs": text, "add_special_tokens": special})
        return self._token_list(answer, "/tokenize")

    async def encode_chat(self, chats: Sequence[Chat]) -> list[list[int]]:
        return await _gather([self._chat(c) for c in chats])

    async def encode_text(self, texts: Sequence[str], special: bool = True) -> list[list[int]]:
        return await _gather([self._text(t, special) for t in texts])


ENGINE_TOKENIZERS: dict[str, type[VllmTokenizer] | type[LlamaCppTokenizer] | type[TgiTokenizer]] = {
    "vllm": VllmTokenizer,
    "sglang": VllmTokenizer,
    "llamacpp": LlamaCppTokenizer,
    "tgi": TgiTokenizer,
}
PROBE = Chat(({"role": "user", "content": "hello"},))


async def engine_tokenizer(
    flavor: str, session: aiohttp.ClientSession, url: str, model: str, headers: Mapping[str, str]
) -> tuple[Tokenizer | None, str]:
    """The flavor's tokenize endpoint if the target answers it, else None; the second value says why not."""
    kind = ENGINE_TOKENIZERS.get(flavor)
    if kind is None:
        return None, f"flavor {flavor} has no known tokenize endpoint"
    tokenizer = kind(session, url, model, headers)
    try:
        await tokenizer.encode_chat([PROBE])
    except TokenizerError as e:
        return None, str(e)
    return tokenizer, ""
