"""Request shapes: what a trace keeps of one request — sizes, timings and keyed prefix hashes, no text.

Producers (proxy, synth, importers) build `RequestShape`s; consumers (replay, inspect, export)
read them. The positional record layout is declared by `FIELDS`, which every trace header
repeats, so readers map values by name and old files keep loading when fields are added.
"""

from __future__ import annotations

import array
import functools
import hashlib
import struct
import sys
from collections.abc import Iterator, Sequence
from typing import (
    Annotated,
    Any,
    Literal,
    NamedTuple,
    NoReturn,
    TypedDict,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

# Endpoint classes (the path prefix before /v1/... is not kept).
Endpoint = Literal["chat", "completions", "embeddings", "other"]
ENDPOINTS: tuple[Endpoint, ...] = get_args(Endpoint)
# The OpenAI path of each class but "other": the proxy classifies a request by its path's tail,
# so any prefix before /v1 is accepted; the replayer sends each class to this path.
ENDPOINT_PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
# A source's request class where it publishes one (Qwen-Bailian's `type`); "" = not recorded. A
# closed set, so that no text a file puts in that field can reach a trace.
RequestType = Literal["", "text", "search", "image", "file", "other"]
# Where the token counts came from: the response's OpenAI `usage`, or llama.cpp's `timings` (its
# stream's finish chunk carries them unasked); "" = neither (output counted from chunks, or unknown).
UsageSource = Literal["", "usage", "timings"]
REQUEST_TYPES: tuple[RequestType, ...] = get_args(RequestType)


# Message roles are a closed vocabulary stored one letter each, so a role can never carry text.
ROLE_LETTERS = {"system": "s", "user": "u", "assistant": "a", "tool": "t", "developer": "d", "function": "f"}
OTHER_ROLE = "o"

# Error classes shared by the proxy, the replayer and the reports ("" means success); stored in
# traces and results as these strings. Every site that sets one is checked against this set by mypy.
ErrorClass = Literal[
    "",
    "http_4xx",
    "http_5xx",
    "connect",
    "timeout",
    "reset",
    "bad_stream",
    "client_cancel",
    "other",
]
ERROR_CLASSES: tuple[ErrorClass, ...] = get_args(ErrorClass)


def http_error(status: int) -> ErrorClass:
    """The error class an HTTP status alone says ("" below 400): the one rule of the proxy, the
    replayer and the output check, so a 4xx is counted as the same failure everywhere."""
    if status >= 500:
        return "http_5xx"
    if status >= 400:
        return "http_4xx"
    return ""


# Sampling parameters whose *values* may be kept: numbers and booleans only.
SAMPLING_VALUE_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "logprobs",
    "top_logprobs",
)
# Parameters that may carry user text: only their presence is kept.
SAMPLING_PRESENCE_KEYS = ("stop", "logit_bias", "user", "response_format", "tools", "tool_choice")

_SAMPLING_ORDER = {name: i for i, name in enumerate(SAMPLING_VALUE_KEYS + SAMPLING_PRESENCE_KEYS)}
_PRESENCE = frozenset(SAMPLING_PRESENCE_KEYS)
_NUMBER = (bool, int, float)
_ABSENT: tuple[object, ...] = (None, [], {}, "")

HASH_SCHEME = "blake2b64-chain-v1"
UNKNOWN = -1

# What one request can be: an input file's value past these is damage or a mistake, refused before
# anything is sized or looped by it (docs/formats.md, "Limits").
MAX_TOKENS = 1 << 24  # input or output tokens of one request (16 Mi; the longest context windows hold ~10 M)
MAX_OFFSET_S = 4.0e9  # arrival offset or timestamp in seconds (~127 years: epoch seconds and int64 ns fit)


def endpoint_named(name: str) -> Endpoint:
    """The endpoint class called `name` (read from a file or an option); ValueError for others."""
    for endpoint in ENDPOINTS:
        if endpoint == name:
            return endpoint
    raise ValueError(f"unknown endpoint {name!r}; valid: {', '.join(ENDPOINTS)}")


class _ReadOnlyMap(dict[str, float | int | bool]):
    """The one empty sampling map shared by every shape made without one, so it refuses changes."""

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a shape's sampling map is read-only; build a new shape with _replace")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse


NO_SAMPLING: dict[str, float | int | bool] = _ReadOnlyMap()


# Annotations that name a column kind the type alone does not give.
Hash64 = Annotated[int, "u8"]  # a keyed 64-bit hash, stored unsigned
BlockHashList = Annotated[Sequence[int], "ragged:u8"]  # one hash per full prefix block
GapList = Annotated[tuple[int, ...], "ragged:u4"]  # microsecond gaps, clamped to u32
HashList = Annotated[tuple[int, ...], "ragged:u8"]  # keyed 64-bit hashes (reply links)


class RequestShape(NamedTuple):
    """One request as recorded. Integer fields use -1 for "unknown"; times are nanoseconds.

    A named tuple because a shape *is* its trace record, in the order FIELDS declares: a writer
    turns a batch of shapes into columns with one `zip(*shapes)`, which cost a third of reading
    25 attributes one by one (benchmarks/trace_io.py). Build variants with `shape._replace(...)`.
    """

    offset_ns: int  # arrival, relative to the trace file's start
    endpoint: Endpoint = "chat"
    model: str = ""
    stream: bool = True
    input_tokens: int = UNKNOWN
    output_tokens: int = UNKNOWN
    output_estimated: bool = False  # output_tokens counted from chunks, not from `usage`
    max_tokens: int = UNKNOWN
    sampling: dict[str, float | int | bool] = NO_SAMPLING
    roles: str = ""  # one letter per message (ROLE_LETTERS); "" for non-chat
    has_tools: bool = False
    has_response_format: bool = False
    prefix_hashes: BlockHashList = ()  # chained keyed 64-bit hashes of full blocks
    prefix_units: int = UNKNOWN  # length of the hashed prompt in the header's block unit
    status: int = 0  # HTTP status; 0 when no response came
    error: ErrorClass = ""
    ttft_ns: int = UNKNOWN  # production time to first content chunk, as the proxy saw it
    e2e_ns: int = UNKNOWN  # production time to end of body (or to the client's cancel)
    chunk_gaps_us: GapList = ()  # gaps between content chunks after the first, microseconds
    cached_tokens: int = UNKNOWN  # prompt tokens the upstream reported as served from its cache
    session: Hash64 = 0  # keyed hash linking turns of one conversation; 0 = none
    turn: int = 0  # depth in the session graph (longest path from a root), 0 for roots
    method: str = "POST"
    request_bytes: int = UNKNOWN
    response_bytes: int = UNKNOWN
    think_ns: int = UNKNOWN  # end of the last-ending reply it waits for -> its arrival
    chat_id: Hash64 = 0  # keyed hash of the conversation plus this reply; 0 = none (cut, failed, not chat)
    parent_id: Hash64 = 0  # keyed hash of the conversation up to the reply this continues; 0 = first turn
    tool_chars: int = UNKNOWN  # characters of tool/function results sent after that reply
    request_type: RequestType = ""  # the source's request class (imports only)
    usage_source: UsageSource = ""  # what input/output/cached_tokens were read from
    # Agent session graphs: the chat_ids of further replies this request waits for besides
    # parent_id (parallel branches it joins, sub-agents whose result it waits for); () = a plain turn.
    join_ids: HashList = ()
    spawned: bool = False  # parent_id is a dependency only: this request opens its own context

    @property
    def message_count(self) -> int:
        return len(self.roles)

    @property
    def chunk_count(self) -> int:
        """Content chunks seen: the first one plus one per recorded gap."""
        return len(self.chunk_gaps_us) + 1 if self.ttft_ns >= 0 else 0


class ShapeFields(TypedDict, total=False):
    """RequestShape's fields as a map filled piece by piece (proxy.extract builds one per exchange
    and ends with `RequestShape(**fields)`), so that mypy checks each entry against its field; an
    absent entry takes the field's default. Same names and types as RequestShape (tests/test_shape.py)."""

    offset_ns: int
    endpoint: Endpoint
    model: str
    stream: bool
    input_tokens: int
    output_tokens: int
    output_estimated: bool
    max_tokens: int
    sampling: dict[str, float | int | bool]
    roles: str
    has_tools: bool
    has_response_format: bool
    prefix_hashes: BlockHashList
    prefix_units: int
    status: int
    error: ErrorClass
    ttft_ns: int
    e2e_ns: int
    chunk_gaps_us: GapList
    cached_tokens: int
    session: Hash64
    turn: int
    method: str
    request_bytes: int
    response_bytes: int
    think_ns: int
    chat_id: Hash64
    parent_id: Hash64
    tool_chars: int
    request_type: RequestType
    usage_source: UsageSource
    join_ids: HashList
    spawned: bool


def _column_kind(hint: Any) -> str:
    """A field's column kind (docs/trace-format.md) from its annotation: `Annotated` names it,
    otherwise the type does (int: i8, bool: b1, str and closed string sets: str, maps: obj)."""
    if get_origin(hint) is Annotated:
        return str(hint.__metadata__[0])
    if hint is bool:
        return "b1"
    if hint is int:
        return "i8"
    if hint is str or get_origin(hint) is Literal:
        return "str"
    if get_origin(hint) is dict:
        return "obj"
    raise TypeError(f"no column kind for {hint!r}")


# Record layout: field name -> column kind, read off RequestShape's annotations, so the fields,
# their order and their kinds have one source. Order is the row order.
FIELD_KINDS: dict[str, str] = {
    name: _column_kind(hint) for name, hint in get_type_hints(RequestShape, include_extras=True).items()
}
FIELDS: tuple[str, ...] = RequestShape._fields


_U32 = "I" if array.array("I").itemsize == 4 else "L"


@functools.cache
def _array_struct(code: str, count: int) -> struct.Struct:
    return struct.Struct(f"<{count}{code}")


class BlockHashes(Sequence[int]):
    """Block hashes kept as their little-endian u64 bytes (`packed`), read as ints on demand.

    Hashes are born as digests and stored as bytes: a recorder or synth that never looks at them
    as numbers never builds, nor frees, ~100 Python ints per request (see benchmarks/trace_io.py).
    Compares and hashes like the tuple of its ints.
    """

    __slots__ = ("packed", "_ints")

    def __init__(self, packed: bytes) -> None:
        self.packed = packed
        self._ints: tuple[int, ...] | None = None

    def ints(self) -> tuple[int, ...]:
        if self._ints is None:
            self._ints = unpack_u64(self.packed)
        return self._ints

    def __len__(self) -> int:
        return len(self.packed) >> 3

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        return self.ints()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ints())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockHashes):
            return self.packed == other.packed
        if isinstance(other, tuple):
            return self.ints() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ints())

    def __repr__(self) -> str:
        return f"BlockHashes({self.ints()!r})"


def pack_u64(values: Sequence[int]) -> bytes:
    packed = getattr(values, "packed", None)
    if packed is not None:
        return bytes(packed)
    return _array_struct("Q", len(values)).pack(*values)


def unpack_u64(data: bytes) -> tuple[int, ...]:
    return _array_struct("Q", len(data) // 8).unpack(data)


def pack_u32(values: Sequence[int]) -> bytes:
    """Pack microsecond gaps; a gap beyond u32 (71 minutes) is clamped rather than wrapped.

    Through `array`, whose range check is the clamp test: a `max` first would cost more than the
    packing (the recorder packs every recorded stream's gaps)."""
    try:
        packed = array.array(_U32, values)
    except OverflowError:
        packed = array.array(_U32, [min(v, 0xFFFFFFFF) for v in values])
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def key_fingerprint(key: bytes) -> str:
    """A short public name for a hash key, so traces hashed with the same key can be recognised."""
    return hashlib.blake2b(b"replayproxy key fingerprint", key=key, digest_size=8).hexdigest()


def prefix_block_hashes(
    units: Sequence[int] | str, block_size: int, key: bytes, known: Sequence[int] = ()
) -> BlockHashes:
    """Chained keyed hashes of each *full* block: h_i = blake2b_key(h_{i-1} || block_i), 64 bits.

    Equal h_i means "equal prefix up to and including block i", which is exactly what a
    prefix cache can reuse (vLLM and SGLang also cache full blocks only). `units` is either token
    ids (4 bytes little-endian each) or text (UTF-8 of `block_size` characters per block).
    `known` are hashes already computed for the leading blocks of these same units (a previous
    turn's prompt); only the blocks after them are hashed, continuing the chain.
    """
    if block_size <= 0:
        raise ValueError(f"block size must be positive, got {block_size}")
    blocks = len(units) // block_size
    known_packed = pack_u64(known)
    if len(known) >= blocks:
        return BlockHashes(known_packed[: 8 * blocks])
    first = len(known)
    if isinstance(units, str):
        payloads = [
            units[i * block_size : (i + 1) * block_size].encode("utf-8") for i in range(first, blocks)
        ]
    else:
        width = 4 * block_size
        data = _array_struct("I", (blocks - first) * block_size).pack(
            *units[first * block_size : blocks * block_size]
        )
        payloads = [data[i : i + width] for i in range(0, len(data), width)]
    base = _keyed_blake2b(key)
    previous = known_packed[-8:] if known else b"\0" * 8
    digests = []
    for payload in payloads:
        h = base.copy()
        h.update(previous)
        h.update(payload)
        previous = h.digest()
        digests.append(previous)
    return BlockHashes(known_packed + b"".join(digests))


@functools.lru_cache(maxsize=64)
def _keyed_blake2b(key: bytes) -> Any:
    """A keyed, empty blake2b state; copying it skips the key setup on every block."""
    return hashlib.blake2b(key=key, digest_size=8)


def role_letters(roles: Sequence[object]) -> str:
    """Encode message roles as letters; anything outside the vocabulary becomes OTHER_ROLE."""
    return "".join(ROLE_LETTERS.get(r, OTHER_ROLE) if isinstance(r, str) else OTHER_ROLE for r in roles)


def keep_sampling(body: dict[str, Any]) -> dict[str, float | int | bool]:
    """The sampling parameters a trace may hold: numeric values, and presence flags for text ones.

    Runs for every recorded request, so only the keys the body has are visited (a set
    intersection), in the order of the key lists, so equal settings encode equally."""
    kept: dict[str, float | int | bool] = {}
    for name in sorted(body.keys() & _SAMPLING_ORDER.keys(), key=_SAMPLING_ORDER.__getitem__):
        value = body[name]
        if name in _PRESENCE:
            if value not in _ABSENT:
                kept[name] = True
        elif isinstance(value, _NUMBER):
            kept[name] = value
    return kept
