"""Prefix-block hashing properties and the privacy of key fingerprints (replayproxy/shape.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
import typing
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replayproxy import trace
from replayproxy.shape import (
    FIELD_KINDS,
    FIELDS,
    OTHER_ROLE,
    RequestShape,
    ShapeFields,
    http_error,
    keep_sampling,
    key_fingerprint,
    pack_u32,
    prefix_block_hashes,
    role_letters,
)
from tests.replay import traces

KEY = b"0123456789abcdef"
keys = st.binary(min_size=8, max_size=64)
token_ids = st.lists(st.integers(0, 2**32 - 1), max_size=200)
block_sizes = st.integers(1, 32)


def reference_hashes(blocks: list[bytes], key: bytes) -> list[int]:
    """The documented scheme, written independently: digest(previous digest || block bytes)."""
    previous, out = b"\0" * 8, []
    for block in blocks:
        previous = hashlib.blake2b(previous + block, key=key, digest_size=8).digest()
        out.append(int.from_bytes(previous, "little"))
    return out


@given(token_ids, block_sizes, keys)
def test_token_hashes_follow_the_documented_scheme(tokens: list[int], block_size: int, key: bytes) -> None:
    full = len(tokens) // block_size
    blocks = [
        b"".join(t.to_bytes(4, "little") for t in tokens[i * block_size : (i + 1) * block_size])
        for i in range(full)
    ]
    assert list(prefix_block_hashes(tokens, block_size, key)) == reference_hashes(blocks, key)


@given(st.text(max_size=120), block_sizes, keys)
def test_text_hashes_use_utf8_char_blocks(text: str, block_size: int, key: bytes) -> None:
    full = len(text) // block_size
    blocks = [text[i * block_size : (i + 1) * block_size].encode("utf-8") for i in range(full)]
    assert list(prefix_block_hashes(text, block_size, key)) == reference_hashes(blocks, key)


@given(token_ids, token_ids, token_ids, block_sizes)
def test_equal_prefixes_give_equal_leading_hashes(
    common: list[int], tail_a: list[int], tail_b: list[int], block_size: int
) -> None:
    a = prefix_block_hashes(common + tail_a, block_size, KEY)
    b = prefix_block_hashes(common + tail_b, block_size, KEY)
    shared = len(common) // block_size
    assert a[:shared] == b[:shared]
    # Chaining: once a block differs, every later hash differs too (no resynchronisation).
    first_diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first_diff is not None:
        assert all(x != y for x, y in zip(a[first_diff:], b[first_diff:], strict=False))


def test_a_changed_early_block_changes_every_later_hash() -> None:
    tokens = list(range(64))
    changed = [999, *tokens[1:]]
    a, b = prefix_block_hashes(tokens, 16, KEY), prefix_block_hashes(changed, 16, KEY)
    assert len(a) == len(b) == 4
    assert all(x != y for x, y in zip(a, b, strict=True))


@given(st.lists(st.integers(0, 2**32 - 1), min_size=16, max_size=100), keys, keys)
def test_different_keys_give_different_hashes(tokens: list[int], key_a: bytes, key_b: bytes) -> None:
    a, b = prefix_block_hashes(tokens, 16, key_a), prefix_block_hashes(tokens, 16, key_b)
    assert (a == b) == (key_a == key_b)


@given(token_ids, block_sizes)
def test_only_full_blocks_are_hashed(tokens: list[int], block_size: int) -> None:
    hashes = prefix_block_hashes(tokens, block_size, KEY)
    assert len(hashes) == len(tokens) // block_size
    # A partial last block changes nothing: dropping it gives the same hashes.
    assert prefix_block_hashes(tokens[: len(hashes) * block_size], block_size, KEY) == hashes


def test_text_and_token_ids_hash_differently() -> None:
    text = "abcdefghijklmnop" * 2
    as_ids = [ord(c) for c in text]
    assert len(prefix_block_hashes(text, 16, KEY)) == len(prefix_block_hashes(as_ids, 16, KEY)) == 2
    assert set(prefix_block_hashes(text, 16, KEY)).isdisjoint(prefix_block_hashes(as_ids, 16, KEY))


@given(token_ids, st.integers(0, 20), block_sizes)
def test_known_hashes_continue_the_chain(tokens: list[int], known_blocks: int, block_size: int) -> None:
    full = prefix_block_hashes(tokens, block_size, KEY)
    known = full[:known_blocks]
    assert prefix_block_hashes(tokens, block_size, KEY, known=known) == full


def test_bad_block_size_is_refused() -> None:
    for size in (0, -16):
        try:
            prefix_block_hashes([1, 2, 3], size, KEY)
        except ValueError as e:
            assert "block size" in str(e)
        else:
            raise AssertionError("a non-positive block size was accepted")


@given(keys)
def test_key_fingerprint_never_reveals_the_key(key: bytes) -> None:
    fingerprint = key_fingerprint(key)
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert fingerprint.encode() != key and key not in fingerprint.encode()
    assert key.hex() not in fingerprint
    assert key_fingerprint(key) == fingerprint  # stable, so traces of one fleet can be matched


def test_key_fingerprints_differ_per_key() -> None:
    fingerprints = {key_fingerprint(bytes([i]) * 16) for i in range(64)}
    assert len(fingerprints) == 64


@pytest.mark.parametrize(
    ("status", "error"),
    [(200, ""), (204, ""), (301, ""), (399, ""), (400, "http_4xx"), (429, "http_4xx"), (499, "http_4xx")]
    + [(500, "http_5xx"), (503, "http_5xx"), (599, "http_5xx")],
)
def test_an_http_status_alone_gives_one_error_class(status: int, error: str) -> None:
    """The proxy, the replayer and the output check all count a status by this one rule."""
    assert http_error(status) == error


def test_roles_are_a_closed_vocabulary() -> None:
    assert (
        role_letters(["system", "user", "assistant", "tool", "secret text", 3])
        == f"suat{OTHER_ROLE}{OTHER_ROLE}"
    )


def test_keep_sampling_keeps_numbers_and_only_presence_of_text() -> None:
    kept = keep_sampling(
        {
            "temperature": 0.7,
            "n": 2,
            "ignore_eos": True,
            "stop": ["secret"],
            "user": "alice",
            "seed": "x",
            "tools": [],
        }
    )
    assert kept == {"temperature": 0.7, "n": 2, "ignore_eos": True, "stop": True, "user": True}
    assert "secret" not in repr(kept) and "alice" not in repr(kept)


def test_chunk_count_and_message_count() -> None:
    assert RequestShape(offset_ns=0, ttft_ns=5, chunk_gaps_us=(1, 2)).chunk_count == 3
    assert RequestShape(offset_ns=0, chunk_gaps_us=()).chunk_count == 0
    assert RequestShape(offset_ns=0, roles="sua").message_count == 3


def test_documented_test_vectors() -> None:
    """The vectors printed in docs/trace-format.md, so another implementation can check itself."""
    key = b"example key"
    assert key_fingerprint(key) == "42857efba8abf594"
    assert prefix_block_hashes(list(range(40)), 16, key) == (0xC1232B560D3B8DEC, 0x3229786B15307E19)
    assert prefix_block_hashes("Grüße aus Köln!", 4, key) == (
        0xAB8C268600736CC9,
        0x852253CD96920BFE,
        0x17FD8EA78695D844,
    )


def test_field_kinds_declare_every_field_in_record_order() -> None:
    """Writers zip shapes into columns by position, so the kinds must follow the tuple's order."""
    assert tuple(FIELD_KINDS) == FIELDS == RequestShape._fields


def test_each_field_kind_fits_the_field_and_survives_the_trace_writer(tmp_path: Path) -> None:
    """Kinds are read off the annotations; check them against what the fields hold and against
    what the production writer and loader keep, so a wrong annotation cannot pass as a layout."""
    fits = {
        "i8": lambda v: type(v) is int,
        "u8": lambda v: type(v) is int and v >= 0,
        "b1": lambda v: type(v) is bool,
        "str": lambda v: type(v) is str,
        "obj": lambda v: isinstance(v, dict),
        "ragged:u8": lambda v: all(0 <= x < 2**64 for x in v),
        "ragged:u4": lambda v: all(0 <= x < 2**32 for x in v),
    }
    shape = RequestShape(
        1, prefix_hashes=(2**64 - 1, 3), chunk_gaps_us=(5, 6), session=2**64 - 1, join_ids=(2**64 - 1, 7)
    )
    assert tuple(FIELD_KINDS) == FIELDS
    for name, kind in FIELD_KINDS.items():
        assert fits[kind](getattr(shape, name)), (name, kind)
    cols = trace.load(traces.write(tmp_path / "kinds.rpt", [shape]))
    for name in FIELDS:
        if name not in ("prefix_hashes", "chunk_gaps_us", "join_ids"):
            assert cols.scalar[name].tolist() == [getattr(shape, name)], name
    assert cols.hashes_of(0).tolist() == list(shape.prefix_hashes)
    assert cols.joins_of(0).tolist() == list(shape.join_ids)
    assert cols.chunk_gaps_us.tolist() == list(shape.chunk_gaps_us)
    links = {"session": "u8", "chat_id": "u8", "parent_id": "u8", "join_ids": "ragged:u8", "spawned": "b1"}
    assert links.items() <= FIELD_KINDS.items()


def test_trace_columns_have_one_typed_attribute_per_scalar_field(tmp_path: Path) -> None:
    from replayproxy.trace.columns import RAGGED, Columns

    declared = [f.name for f in dataclasses.fields(Columns) if not f.init]
    assert declared == [name for name in FIELDS if name not in RAGGED]
    path = traces.write(tmp_path / "t.rpt", [RequestShape(i * 10, input_tokens=i + 3) for i in range(4)])
    cols = trace.load(path)
    assert cols.input_tokens.tolist() == [3, 4, 5, 6] and cols.input_tokens is cols.scalar["input_tokens"]
    shifted = dataclasses.replace(cols, scalar={**cols.scalar, "input_tokens": cols.input_tokens + 1})
    assert shifted.input_tokens.tolist() == [4, 5, 6, 7] and len(shifted) == 4


def test_block_hashes_keep_bytes_and_compare_like_their_ints() -> None:
    hashes = prefix_block_hashes(list(range(64)), 16, KEY)
    ints = tuple(reference_hashes([struct.pack("<16I", *range(i, i + 16)) for i in range(0, 64, 16)], KEY))
    assert len(hashes) == 4 and hashes.packed == struct.pack("<4Q", *ints)
    assert hashes == ints and ints == hashes and hash(hashes) == hash(ints)
    assert hashes[1] == ints[1] and hashes[-2:] == ints[-2:] and list(hashes) == list(ints)
    assert hashes != list(ints)  # like a tuple, unequal to a list
    assert RequestShape(offset_ns=0, prefix_hashes=hashes) == RequestShape(offset_ns=0, prefix_hashes=ints)


def test_the_shared_default_sampling_map_cannot_be_changed() -> None:
    """Every shape made without sampling shares one map: changing it would change them all."""
    first, second = RequestShape(offset_ns=0), RequestShape(offset_ns=1)
    assert first.sampling is second.sampling and first.sampling == {}
    with pytest.raises(TypeError, match="read-only"):
        first.sampling["temperature"] = 0.5
    with pytest.raises(TypeError, match="read-only"):
        first.sampling.update(n=2)
    assert second.sampling == {} and first._replace(sampling={"n": 2}).sampling == {"n": 2}


def test_gaps_pack_little_endian_and_clamp_beyond_u32() -> None:
    packed = pack_u32((1, 70_000, 2**32 + 5))
    assert packed == (1).to_bytes(4, "little") + (70_000).to_bytes(4, "little") + b"\xff" * 4
    assert np.frombuffer(packed, "<u4").tolist() == [1, 70_000, 2**32 - 1]
    assert pack_u32(()) == b""


def test_shape_fields_declare_what_request_shape_declares() -> None:
    """The extractor fills a ShapeFields and unpacks it into a RequestShape: mypy checks each entry
    only while the two declare the same names, in the same order, of the same types."""
    shape = typing.get_type_hints(RequestShape, include_extras=True)
    fields = typing.get_type_hints(ShapeFields, include_extras=True)
    assert list(fields.items()) == list(shape.items())
    assert ShapeFields.__required_keys__ == frozenset()  # filled piece by piece
