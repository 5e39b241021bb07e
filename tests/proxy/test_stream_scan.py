"""StreamScan's bulk runs must give exactly what decoding and classifying every event gives."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from replayproxy.proxy.links import Reply
from replayproxy.proxy.stream_scan import StreamScan
from replayproxy.sse import CONTENT, ERROR, SSEDecoder, classify


def chunk(delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
    return {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


TOKENS = st.text(min_size=1, max_size=6).map(lambda t: t.replace("\0", "x"))
EVENTS = st.one_of(
    TOKENS.map(lambda t: chunk({"content": t})),
    TOKENS.map(lambda t: chunk({"reasoning_content": t})),
    st.just(chunk({"role": "assistant", "content": ""})),
    st.just(chunk({"content": ""})),
    st.just(chunk({}, "stop")),
    st.just({"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
    st.just({"error": {"message": "boom"}}),
    st.just("[DONE]"),
    st.just(": ping"),
)


def wire(event: object, crlf: bool) -> bytes:
    end = b"\r\n\r\n" if crlf else b"\n\n"
    if event == ": ping":
        return b": ping" + end
    data = event if isinstance(event, str) else json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode() + end


def truth(pieces: list[bytes], times: list[int]) -> tuple[list[int], object, bool]:
    """Every event decoded and parsed, no shortcuts: the times of content events, last usage, error."""
    decoder = SSEDecoder()
    content, usage, bad = [], None, False
    for piece, at in zip(pieces, times, strict=True):
        for event in decoder.feed(piece):
            info = classify(event.data)
            if info.kind == CONTENT:
                content.append(at)
            bad = bad or info.kind == ERROR
            usage = info.usage if info.usage is not None else usage
    return content, usage, bad


def reply_truth(pieces: list[bytes]) -> str:
    """The reply's text, every event parsed: the `content` of each content chunk's delta."""
    decoder = SSEDecoder()
    text = []
    for piece in pieces:
        for event in decoder.feed(piece):
            if classify(event.data).kind == CONTENT:
                text.append(json.loads(event.data)["choices"][0]["delta"].get("content") or "")
    return "".join(text)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(EVENTS, max_size=40),
    crlf=st.booleans(),
    cuts=st.one_of(st.none(), st.lists(st.integers(min_value=1, max_value=4000), max_size=12)),
    groups=st.lists(st.integers(min_value=1, max_value=3), max_size=40),
)
def test_scan_equals_decoding_every_event(
    events: list[object], crlf: bool, cuts: list[int] | None, groups: list[int]
) -> None:
    reads = [wire(event, crlf) for event in events]  # one event per read, as engines write them
    if cuts is not None:  # or any split of the same bytes: halves, several events per read
        body = b"".join(reads)
        bounds = sorted({c for c in cuts if c < len(body)})
        reads = [body[a:b] for a, b in zip([0, *bounds], [*bounds, len(body)], strict=True)]
    elif groups:  # or whole events, a few to a read
        grouped, at = [], 0
        for size in groups:
            grouped.append(b"".join(reads[at : at + size]))
            at += size
        reads = [read for read in grouped if read] + reads[at:]
    times = [1000 * (i + 1) for i in range(len(reads))]
    reply = Reply()
    scan = StreamScan(reads, times, reply)
    assert (scan.content_ns, scan.usage, scan.bad) == truth(reads, times)
    assert reply.finish() == (reply_truth(reads), [])


def test_a_long_plain_stream_is_one_run_and_gaps_are_microseconds() -> None:
    reads = [wire(chunk({"role": "assistant", "content": ""}), False)]
    reads += [wire(chunk({"content": f"t{i}"}), False) for i in range(200)]
    reads += [wire(chunk({}, "stop"), False), wire("[DONE]", False)]
    times = [1_000_000 + 1500 * i for i in range(len(reads))]
    scan = StreamScan(reads, times)
    assert scan.content_ns == times[1:201]
    assert scan.gaps_us() == (1,) * 199  # 1.5 µs apart, floored


def test_envelopes_that_change_mid_stream_are_followed() -> None:
    """Reasoning then content: two envelopes, each a run; an empty token between them is no content."""
    reads = [wire(chunk({"reasoning_content": f"r{i}"}), False) for i in range(30)]
    reads += [wire(chunk({"content": ""}), False)]
    reads += [wire(chunk({"content": f"c{i}"}), False) for i in range(40)]
    times = list(range(len(reads)))
    assert StreamScan(reads, times).content_ns == times[:30] + times[31:]


def test_reads_that_only_look_like_the_envelope_are_decoded() -> None:
    """Reads that begin and end like the envelope but are not one event of it, each amid a run."""
    plain = [wire(chunk({"content": f"t{i}"}), False) for i in range(8)]
    cut = plain[0].index(b't0"')
    prefix, suffix = plain[0][:cut], plain[0][cut + 2 :]
    two_events = plain[0] + plain[1]
    empty_then_key = prefix + b'","x":"y' + suffix  # "content":"" and one more key
    overlapped = prefix + suffix[1:]  # the string's quotes are one byte: not JSON
    empty = prefix + suffix
    split_token = [plain[0][: cut + 1], plain[0][cut + 1 :]]  # one event over two reads
    other_end = prefix + b"x" + suffix[:-2] + b",\n\n"  # the same length, another ending
    nul_inside = [plain[0] + b"\0" + prefix + b"y", b"z" * len(plain[0]) + suffix]  # one event, then junk
    for odd in ([two_events], [empty], [empty_then_key], [overlapped], [other_end], split_token, nul_inside):
        reads = [*plain[:4], *odd, *plain[4:]]
        times = list(range(len(reads)))
        assert StreamScan(reads, times).content_ns == truth(reads, times)[0]
