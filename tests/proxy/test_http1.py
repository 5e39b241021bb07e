"""HTTP/1.1 heads on the forwarding path (replayproxy/proxy/http1.py): hop-by-hop fields dropped,
the proxy's framing put where the message's was, names and order kept as received."""

from __future__ import annotations

import pytest

from replayproxy.proxy.http1 import (
    chunk,
    connection_options,
    end_to_end,
    error_response,
    field_values,
    is_chunked,
    serialize,
    status_has_no_body,
)

HEAD = [
    (b"Host", b"engine"),
    (b"Connection", b"keep-alive, X-Secret-Hop"),
    (b"X-Secret-Hop", b"1"),
    (b"Keep-Alive", b"timeout=5"),
    (b"Content-Type", b"application/json"),
    (b"Transfer-Encoding", b"chunked"),
    (b"TE", b"trailers"),
    (b"Accept", b"*/*"),
]


def test_connection_lists_its_options_lower_cased_across_fields() -> None:
    assert connection_options([*HEAD, (b"connection", b" Upgrade ")]) == {
        b"keep-alive",
        b"x-secret-hop",
        b"upgrade",
    }
    assert connection_options([(b"Host", b"x")]) == frozenset()


def test_hop_by_hop_and_listed_fields_are_dropped_and_framing_takes_the_old_place() -> None:
    out = end_to_end(HEAD, [(b"Content-Length", b"12")])
    assert out == [
        (b"Host", b"engine"),
        (b"Content-Type", b"application/json"),
        (b"Content-Length", b"12"),  # where Transfer-Encoding was
        (b"Accept", b"*/*"),
    ]


def test_the_same_framing_field_keeps_its_spelling() -> None:
    head = [(b"content-length", b"5"), (b"Accept", b"*/*")]
    assert end_to_end(head, [(b"Content-Length", b"7")]) == [(b"content-length", b"7"), (b"Accept", b"*/*")]


def test_framing_is_appended_when_the_message_had_none_and_drop_removes_more() -> None:
    head = [(b"Host", b"engine"), (b"Authorization", b"Bearer k")]
    assert end_to_end(head, [(b"Transfer-Encoding", b"chunked")], drop=frozenset({b"authorization"})) == [
        (b"Host", b"engine"),
        (b"Transfer-Encoding", b"chunked"),
    ]
    assert end_to_end([(b"Content-Length", b"3")], []) == []  # no framing of its own: the field goes


def test_header_lookup_and_chunked_detection_ignore_case() -> None:
    values = field_values([*HEAD, (b"content-type", b"text/plain")])
    assert values[b"content-type"] == b"application/json" and b"x-none" not in values  # the first one
    assert is_chunked(values) and is_chunked(field_values([(b"transfer-encoding", b"gzip, Chunked ")]))
    assert not is_chunked(field_values([(b"Transfer-Encoding", b"gzip")])) and not is_chunked({})


def test_connection_options_are_dropped_whether_or_not_the_values_are_given() -> None:
    head = [(b"X-Hop", b"1"), (b"Accept", b"*/*"), (b"connection", b"x-hop")]
    for values in (None, field_values(head)):
        assert end_to_end(head, [], values=values) == [(b"Accept", b"*/*")]
    plain = [(b"Accept", b"*/*"), (b"Upgrade", b"h2c")]
    assert end_to_end(plain, [], values=field_values(plain)) == [(b"Accept", b"*/*")]


def test_heads_and_chunks_serialize_as_rfc_9112_writes_them() -> None:
    assert serialize(b"GET / HTTP/1.1", [(b"Host", b"x")], [(b"X-A", b"1")]) == (
        b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n\r\n"
    )
    assert chunk(b"hello, world!!!!") == b"10\r\nhello, world!!!!\r\n" and chunk(b"") == b"0\r\n\r\n"


def test_the_proxys_own_error_answer_is_a_complete_small_response() -> None:
    answer = error_response(502, close=True)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n") and b"Connection: close" in head
    assert body == b"502 Bad Gateway\n" and f"Content-Length: {len(body)}".encode() in head
    assert b"Connection" not in error_response(504, close=False)
    assert error_response(504, close=False).startswith(b"HTTP/1.1 504 Gateway Timeout")


@pytest.mark.parametrize(
    ("status", "method", "bodiless"),
    [
        (200, b"GET", False),
        (200, b"HEAD", True),
        (101, b"GET", True),
        (204, b"POST", True),
        (304, b"GET", True),
        (404, b"GET", False),
    ],
)
def test_which_answers_carry_no_body(status: int, method: bytes, bodiless: bool) -> None:
    assert status_has_no_body(status, method) is bodiless
