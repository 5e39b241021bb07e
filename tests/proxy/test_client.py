"""The client side and its exchanges driven without sockets: scripted byte splits and ticks.

Every case is played whole and at every split of the request and of the response (two pieces
exhaustively, more with hypothesis); what the upstream and the client are sent must not depend on
how the bytes arrived.
"""

from __future__ import annotations

import httptools
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayproxy.proxy import http1
from replayproxy.proxy.exchange import TRANSITIONS, State
from tests.proxy.helpers import CaptureSink
from tests.proxy.machine import Machine, ScriptedLink, machine, splits, two_piece_splits

GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CHUNKED_WITH_TRAILER = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n"
)


class Decoded:
    """A message as its recipient reads it: chunk boundaries are the sender's choice, not content."""

    def __init__(self, data: bytes, response: bool) -> None:
        self.start: list[object] = []
        self.fields: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.complete = False
        parser = (httptools.HttpResponseParser if response else httptools.HttpRequestParser)(self)
        parser.feed_data(data)
        self.start = [parser.get_status_code() if response else (parser.get_method(), self.url)]

    url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))  # head fields, then trailer fields

    def on_body(self, piece: bytes) -> None:
        self.body += piece

    def on_message_complete(self) -> None:
        self.complete = True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Decoded) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return repr(vars(self))


def same_message(sent: bytes, expected: bytes, response: bool) -> bool:
    """Byte-equal, or (for chunked bodies, which are re-framed per read) equal as read."""
    if sent == expected:
        return True
    if b"chunked" not in expected:
        return False
    return Decoded(sent, response) == Decoded(expected, response)


def play(request: list[bytes], response: list[bytes], **options: object) -> Machine:
    m = machine(**options)  # type: ignore[arg-type]
    for piece in request:
        m.side.feed(piece)
    if m.pool.lent and response:
        m.upstream.answer(response)
    return m


CASES = {
    # name: (request, response, the upstream's request, the client's answer)
    "plain": (GET, OK, GET, OK),
    "chunked both ways, trailers accepted": (
        b"POST /c HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nwiki\r\n0\r\n\r\n",
        CHUNKED_WITH_TRAILER,
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwiki\r\n0\r\n\r\n",
        CHUNKED_WITH_TRAILER,
    ),
    "trailers not accepted": (
        GET,
        CHUNKED_WITH_TRAILER,
        GET,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    ),
    "POST offering h2c with a body": (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMA\r\nContent-Length: 25\r\n\r\nGET /in-body HTTP/1.1\r\n\r\n",
        OK,
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 25\r\n\r\n"
        b"GET /in-body HTTP/1.1\r\n\r\n",
        OK,
    ),
    "pipelined after Connection: close": (
        b"GET /A HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /B HTTP/1.1\r\nHost: x\r\n\r\n",
        OK,
        b"GET /A HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    ),
    "interim 103 passes, 100 does not": (
        GET,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK,
        GET,
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK,
    ),
    "bodiless 204 keeps the connection": (
        GET,
        b"HTTP/1.1 204 No Content\r\nETag: e\r\n\r\n",
        GET,
        b"HTTP/1.1 204 No Content\r\nETag: e\r\n\r\n",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_every_two_piece_split_of_request_and_response_gives_the_same_bytes(name: str) -> None:
    request, response, upstream_sees, client_sees = CASES[name]
    for request_pieces in two_piece_splits(request):
        m = play(request_pieces, [response])
        assert same_message(bytes(m.upstream.sent), upstream_sees, response=False), request_pieces
        assert same_message(bytes(m.link.sent), client_sees, response=True), request_pieces
    for response_pieces in two_piece_splits(response):
        m = play([request], response_pieces)
        assert same_message(bytes(m.link.sent), client_sees, response=True), response_pieces


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(CASES)),
    request_cuts=st.lists(st.integers(0, 400), max_size=6),
    response_cuts=st.lists(st.integers(0, 200), max_size=6),
)
def test_any_split_gives_the_same_bytes(name: str, request_cuts: list[int], response_cuts: list[int]) -> None:
    request, response, upstream_sees, client_sees = CASES[name]
    m = play(splits(request, request_cuts), splits(response, response_cuts))
    assert same_message(bytes(m.upstream.sent), upstream_sees, response=False)
    assert same_message(bytes(m.link.sent), client_sees, response=True)


def test_the_connection_closes_after_a_close_request_and_its_answer() -> None:
    m = play([CASES["pipelined after Connection: close"][0]], [OK])
    assert m.link.closed and not m.side.queue
    assert m.pool.released == [(m.upstream, True)]


@pytest.mark.parametrize(
    ("target", "seen"),
    [
        (b"/../admin", b"/api/v1/admin"),
        (b"http://h/../../admin", b"/api/v1/admin"),
        (b"/a/./b/..", b"/api/v1/a/"),
    ],
)
def test_dot_segments_are_removed_before_the_prefix(target: bytes, seen: bytes) -> None:
    request = b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n" % target
    for pieces in two_piece_splits(request):
        m = play(pieces, [OK], upstream="http://engine:8000/api/v1/")
        assert bytes(m.upstream.sent).split(b" ")[1] == seen


def test_a_percent_encoded_dot_segment_under_a_prefix_is_a_400_and_never_sent() -> None:
    m = play([b"GET /%2E%2e/admin HTTP/1.1\r\nHost: x\r\n\r\n"], [], upstream="http://engine:8000/api")
    assert m.link.sent.startswith(b"HTTP/1.1 400 ") and m.link.closed
    assert m.pool.lent == []


@pytest.mark.parametrize(
    "request_",
    [
        b"GET /v1/models HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nhost: y\r\n\r\n",  # two Host fields
        b"GET /v1/models HTTP/1.0\r\nHost: x\r\nHOST: x\r\n\r\n",
    ],
)
def test_a_request_without_exactly_one_host_is_a_400_and_never_sent(request_: bytes) -> None:
    """RFC 9112 §3.2."""
    for pieces in two_piece_splits(request_):
        m = play(pieces, [OK])
        assert m.link.sent.startswith(b"HTTP/1.1 400 Bad Request\r\n") and m.link.closed
        assert m.pool.lent == []


def test_an_http10_client_gets_the_proxys_own_version_and_a_body_it_can_frame() -> None:
    """RFC 9110 §6.2: a server answers with the highest minor version it conforms to (HTTP/1.1),
    as nginx does; an HTTP/1.0 client cannot read the chunked coding, so the close ends the body."""
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    for request in (b"GET /v1/models HTTP/1.0\r\n\r\n", b"GET /v1/models HTTP/1.0\r\nHost: x\r\n\r\n"):
        for pieces in two_piece_splits(chunked):
            m = play([request], pieces)
            assert bytes(m.link.sent) == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello"
            assert m.link.closed
        m = play([request.replace(b"\r\n\r\n", b"\r\nConnection: keep-alive\r\n\r\n")], [OK])
        kept = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"
        assert bytes(m.link.sent) == kept
        assert not m.link.closed
        m = play([request], [])
        m.upstream.lose()  # a fresh connection that closed unanswered: the proxy's own 502
        assert m.link.sent.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")


def test_a_close_delimited_body_stays_close_delimited() -> None:
    response = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
    for pieces in two_piece_splits(response):
        m = play([GET], pieces)
        assert not m.link.closed  # the end is not known until the upstream closes
        m.upstream.lose()
        assert (
            bytes(m.link.sent)
            == b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the end"
        )
        assert m.link.closed and m.forwarder.hot.upstream_errors == {}


def test_a_response_head_past_the_cap_is_a_502() -> None:
    response = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 3000 + b"\r\nContent-Length: 2\r\n\r\nok"
    for pieces in (splits(response, [10, 1500, 2990]), [response]):
        m = play([GET], pieces, max_response_head_bytes=2048)
        assert m.link.sent.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
        assert m.forwarder.hot.upstream_errors == {"bad_stream": 1}
        assert m.upstream.closed


UPGRADE = b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"


def test_a_101_turns_the_connection_into_a_tunnel_with_held_bytes_first() -> None:
    for pieces in two_piece_splits(UPGRADE + b"early"):
        m = play(pieces, [])
        assert b"Connection: upgrade\r\nUpgrade: websocket" in m.upstream.sent
        assert m.link.paused  # the bytes after an offer wait for its answer
        m.upstream.answer(
            [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhi"]
        )
        assert (
            m.link.sent
            == b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhi"
        )
        assert m.upstream.sent.endswith(b"\r\n\r\nearly") and not m.link.paused
        m.side.feed(b"later")
        m.upstream.answer([b"back"])
        assert m.upstream.sent.endswith(b"earlylater") and m.link.sent.endswith(b"hiback")
        [ex] = m.side.queue
        assert ex.state is State.TUNNEL
        m.upstream.lose()
        assert m.link.closed and m.forwarder.hot.client_cancels == 0


def test_an_upgrade_declined_resumes_http_with_the_held_bytes() -> None:
    for pieces in two_piece_splits(UPGRADE + GET):
        m = play(pieces, [])
        first = m.pool.lent[0]
        first.answer([OK])
        assert bytes(m.link.sent) == OK and not m.link.paused
        second = m.pool.lent[1]
        assert bytes(second.sent) == GET
        second.answer([OK])
        assert bytes(m.link.sent) == OK + OK


def test_an_unasked_101_is_a_bad_stream() -> None:
    m = play([GET], [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nraw"])
    assert m.link.sent.startswith(b"HTTP/1.1 502 ") and b"raw" not in m.link.sent


def test_timers_header_connect_first_byte_idle() -> None:
    header = machine(client_header_timeout_s=0.1)
    header.side.feed(b"GET / HTTP/1.1\r\n")
    header.tick(2)
    assert not header.link.closed
    header.tick(2)
    assert header.link.closed and header.link.sent == b""  # like nginx: no answer to a head never finished

    connect = machine(hold=True, connect_timeout_s=0.1)
    connect.side.feed(GET)
    connect.tick(4)
    assert connect.link.sent.startswith(b"HTTP/1.1 504 ") and connect.pool.waiting == []

    first_byte = machine(first_byte_timeout_s=0.1)
    first_byte.side.feed(GET)
    first_byte.tick(4)
    assert first_byte.link.sent.startswith(b"HTTP/1.1 504 ") and first_byte.upstream.closed

    idle = machine(idle_timeout_s=0.1)
    idle.side.feed(GET)
    idle.upstream.answer([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"])
    idle.tick(2)
    idle.upstream.answer([b"de"])  # a read restarts the idle timer
    idle.tick(2)
    assert not idle.link.closed
    idle.tick(2)
    assert idle.link.sent.endswith(b"abcde") and idle.link.closed  # cut, as behind nginx
    assert idle.forwarder.hot.upstream_errors == {"timeout": 1}


def test_a_queued_request_is_never_answered_out_of_order_by_a_timer() -> None:
    m = machine(total_timeout_s=0.1)
    m.side.feed(GET + GET)
    first, second = m.side.queue
    assert (first.state, second.state) == (State.AWAITING, State.QUEUED)
    m.tick(2)
    assert (first.state, second.state, m.link.sent) == (State.AWAITING, State.QUEUED, b"")
    m.tick(2)  # both past the limit: answered in order, the second once the first is done
    assert m.link.sent.count(b"HTTP/1.1 504 Gateway Timeout") == 2
    assert [conn.closed for conn in m.pool.lent] == [True, True]


def test_every_state_is_in_the_table_and_done_is_final() -> None:
    assert set(TRANSITIONS) == set(State)
    assert TRANSITIONS[State.DONE] == frozenset()
    reachable = {State.HEAD}
    for _ in State:
        reachable |= {b for a in reachable for b in TRANSITIONS[a]}
    assert reachable == set(State)


VLLM_ENVELOPE = b'"id":"c","object":"chat.completion.chunk","created":1,"model":"m"'


def test_fields_the_usage_event_took_go_back_to_the_finish_event_and_the_event_goes_whole() -> None:
    """llama.cpp moves `timings` from its finish chunk to the usage event when usage is asked for."""
    body = orjson.dumps({"model": "m", "stream": True, "messages": []})
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (
        len(body),
        body,
    )
    token = b'data: {%b,"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n' % VLLM_ENVELOPE
    finish = b'data: {%b,"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]' % VLLM_ENVELOPE
    timings = b'"timings":{"prompt_n":1,"cache_n":3}'
    events = (
        token
        + finish
        + b"}\n\n"
        + b'data: {%b,"choices":[],"usage":{"prompt_tokens":4},%b}\n\n' % (VLLM_ENVELOPE, timings)
        + b"data: [DONE]\n\n"
    )
    direct = token + finish + b"," + timings + b"}\n\n" + b"data: [DONE]\n\n"
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%b" % (
        len(events),
        events,
    )
    for pieces in two_piece_splits(response):
        m = play([request], pieces, observer=CaptureSink())
        assert b"include_usage" in m.upstream.sent
        assert Decoded(bytes(m.link.sent), response=True).body == direct


class WritesKept(ScriptedLink):
    """A client link that keeps each write apart, to see what went out before the rest was parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        super().write(data)
        self.writes.append(data)


def test_the_first_body_piece_goes_out_before_the_rest_of_its_read_is_parsed() -> None:
    """A burst of events in one read: the head and the first event are written at once (the first
    token's latency), the other events in one more write; later reads stay one write each."""
    events = [b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(4)]
    chunks = [b"%x\r\n%b\r\n" % (len(e), e) for e in events]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    link = WritesKept()
    m = machine(link=link)
    m.side.feed(GET)
    m.upstream.answer([head + b"".join(chunks[:3]), chunks[3] + b"0\r\n\r\n"])
    first, rest, last = link.writes
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and first.endswith(chunks[0])
    assert rest == chunks[1] + chunks[2]
    assert last == chunks[3] + b"0\r\n\r\n"


# ------------------------------------------------------------------ a stream's end: one write, judged upstrea

SSE_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
LAST = b"data: [DONE]\n\n"
STREAM_POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def streamed(reads: list[bytes], **options: object) -> tuple[Machine, WritesKept, CaptureSink]:
    link, sink = WritesKept(), CaptureSink()
    m = machine(observer=sink, link=link, **options)  # type: ignore[arg-type]
    m.side.feed(STREAM_POST)
    m.upstream.answer(reads)
    return m, link, sink


def test_the_last_event_and_the_chunked_terminator_go_out_in_one_write() -> None:
    for request in (
        STREAM_POST,
        STREAM_POST.replace(b"Content-Length", b"Connection: close\r\nContent-Length"),
    ):
        link, sink = WritesKept(), CaptureSink()
        m = machine(observer=sink, link=link)
        m.side.feed(request)
        m.upstream.answer([SSE_OK + http1.chunk(EVENT), http1.chunk(LAST)])
        assert LAST not in link.sent  # held: the body's end is one read away
        m.upstream.answer([b"0\r\n\r\n"])
        assert link.writes[-1] == http1.chunk(LAST) + b"0\r\n\r\n"
        assert sink.captures[0].error == "" and m.forwarder.hot.client_cancels == 0


def test_a_last_event_whose_end_does_not_follow_goes_out_at_the_next_tick() -> None:
    m, link, _ = streamed([SSE_OK + http1.chunk(EVENT), http1.chunk(LAST)])
    m.tick()
    assert link.writes[-1] == http1.chunk(LAST) and not link.closed
    m.upstream.answer([b"0\r\n\r\n"])
    assert link.writes[-1] == b"0\r\n\r\n"


@pytest.mark.parametrize("tick", [True, False])
def test_a_client_that_closes_after_the_last_event_was_forwarded_completed_its_stream(tick: bool) -> None:
    """Completion is what the upstream sent and the proxy forwarded, not whether the client stayed."""
    m, link, sink = streamed([SSE_OK + http1.chunk(EVENT), http1.chunk(LAST)])
    if tick:
        m.tick()  # the last event is out, the body's end is not
    m.side.lost()
    [capture] = sink.captures
    if tick:
        assert capture.error == "" and m.forwarder.hot.client_cancels == 0
    else:  # the client left before the last event reached it: a cancel
        assert capture.error == "client_cancel" and m.forwarder.hot.client_cancels == 1
    assert m.upstream.closed and m.pool.released == []  # its body's end unread: never reused


def test_a_client_that_closes_mid_stream_cancelled() -> None:
    m, _, sink = streamed([SSE_OK + http1.chunk(EVENT)])
    m.side.lost()
    assert sink.captures[0].error == "client_cancel" and m.upstream.closed
