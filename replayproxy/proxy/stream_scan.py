"""Which reads of a captured SSE body carried generated content, and the usage it reported.

Runs in the recorder process for every recorded stream, so its cost is most of what recording
costs (the proxy's CPU budget for recording). Engines write one `data:` event per read with the same envelope
around every token; once `StreamClassifier` has learned that envelope, a whole run of such reads
is accepted by comparing the joined reads with the envelope put back around their tokens
(`_all_whole_events`) instead of a test per read: in CPython a bytes method call costs about a
thousand instructions, a byte compared or copied far less than one. Anything else goes through
the decoder and `classify`, one read at a time.
"""

from __future__ import annotations

from itertools import repeat
from operator import floordiv, sub

import orjson

from replayproxy.proxy.links import Reply
from replayproxy.sse import (
    CONTENT,
    ERROR,
    SSEDecoder,
    StreamClassifier,
    Usage,
    fitting_envelope,
    parse_timings,
)

_Envelope = tuple[bytes, bytes]  # (bytes before the token, bytes after it) of a whole `data:` event
_SEP = b"\0"  # joins tokens for the bulk test
_CONTENT_KEY = b'"content":"'  # an envelope around the reply's text (not reasoning, not a completion)


class StreamScan:
    """The result: content times in read order, the last usage and the last llama.cpp `timings`
    seen (counts an engine reports unasked), and whether an error event came.
    Given a `Reply`, the content is also collected into it: a whole run of reads as one slice of
    their joined bytes, other content events parsed (chat turn links need the reply's text)."""

    __slots__ = ("content_ns", "usage", "timings", "bad", "_reply")

    def __init__(self, pieces: list[bytes], piece_ns: list[int], reply: Reply | None = None) -> None:
        if len(pieces) != len(piece_ns):
            raise ValueError(f"{len(pieces)} reads but {len(piece_ns)} read times")
        self.content_ns: list[int] = []
        self.usage: Usage | None = None
        self.timings: Usage | None = None
        self.bad = False
        self._reply = reply
        self._scan(pieces, piece_ns)

    def gaps_us(self) -> tuple[int, ...]:
        """Microseconds between consecutive content reads (the recorded inter-token gaps)."""
        ns = self.content_ns
        return tuple(map(floordiv, map(sub, ns[1:], ns), repeat(1000)))

    def _scan(self, pieces: list[bytes], piece_ns: list[int]) -> None:
        decoder = SSEDecoder()
        classifier = StreamClassifier()
        envelopes = classifier.event_templates
        content_ns = self.content_ns
        boundary = True  # the decoder holds nothing: a read can be taken as whole events
        hopeful = True  # no bulk test of the whole rest has failed yet
        at, stop = 0, len(pieces)
        while at < stop:
            piece = pieces[at]
            if boundary and envelopes:
                envelope = _envelope_of(piece, envelopes)
                if envelope is not None:
                    end, hopeful = _run_end(pieces, at, stop, envelope, hopeful)
                    content_ns += piece_ns[at:end]
                    if self._reply is not None:
                        _collect_run(self._reply, pieces[at:end], envelope)
                    at = end
                    continue
            if boundary and (
                piece.startswith(b"data: ") and piece.endswith(b"\n\n") and piece.count(b"\n") == 2
            ):
                datas = [piece[6:-2]]  # the decoder's own fast path, without the call
            else:
                datas = [event.data for event in decoder.feed(piece)]
                boundary = piece.endswith(b"\n\n") and piece.find(b"\r") < 0
            for data in datas:
                info = classifier.classify(data)
                if info.kind == CONTENT:
                    content_ns.append(piece_ns[at])
                    if self._reply is not None:
                        _collect_event(self._reply, data, classifier)
                elif info.kind == ERROR:
                    self.bad = True
                if (info.kind != CONTENT or info.finish_reason) and data.find(b'"timings"') >= 0:
                    self._timings(data)  # a few events per stream: the finish chunk, usage, [DONE]
                if info.usage is not None:
                    self.usage = info.usage
            at += 1

    def _timings(self, data: bytes) -> None:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(obj, dict):
            self.timings = parse_timings(obj.get("timings")) or self.timings


def _collect_run(reply: Reply, run: list[bytes], envelope: _Envelope) -> None:
    """The tokens of a run of whole events, still escaped: the joined reads without the envelope's
    outer ends and with every suffix-prefix seam taken out (a seam starts with the closing quote,
    so it cannot occur inside a token)."""
    prefix, suffix = envelope
    if prefix.endswith(_CONTENT_KEY):
        reply.escaped(b"".join(run)[len(prefix) : -len(suffix)].replace(suffix + prefix, b""))


def _collect_event(reply: Reply, data: bytes, classifier: StreamClassifier) -> None:
    envelope = fitting_envelope(data, classifier.templates)
    if envelope is not None:
        if envelope[0].endswith(_CONTENT_KEY):
            reply.escaped(data[len(envelope[0]) : -len(envelope[1])])
        return
    try:
        reply.chunk(orjson.loads(data))
    except orjson.JSONDecodeError:
        return


def _envelope_of(piece: bytes, envelopes: list[_Envelope]) -> _Envelope | None:
    """The envelope `piece` is exactly one whole `data:` event of, if any."""
    envelope = fitting_envelope(piece, envelopes)
    return envelope if envelope is not None and piece.count(b"\n") == 2 else None


def _run_end(
    pieces: list[bytes], start: int, stop: int, envelope: _Envelope, hopeful: bool
) -> tuple[int, bool]:
    """End of the run of reads from `start` (which fits) that are whole events of `envelope`, and
    whether to try the whole rest again next time. Usual stream: a few trailing reads (finish,
    usage, [DONE]) are set aside and the rest passes one bulk test. Otherwise the run is found
    by doubling then halving its length; `hopeful` turns off so a stream that keeps breaking its
    runs never pays for a bulk test of its whole rest more than once."""
    if hopeful:
        tail = stop
        while tail > start + 1 and stop - tail < 3 and _envelope_of(pieces[tail - 1], [envelope]) is None:
            tail -= 1
        if _all_whole_events(pieces[start:tail], envelope):
            return tail, True
    good, size = 1, 2  # pieces[start:start + good] fit
    while start + size <= stop and _all_whole_events(pieces[start : start + size], envelope):
        good, size = size, size * 2
    bad = min(size, stop - start + 1)  # pieces[start:start + bad] do not all fit (or run past stop)
    while bad - good > 1:
        mid = (good + bad) // 2
        if _all_whole_events(pieces[start : start + mid], envelope):
            good = mid
        else:
            bad = mid
    return start + good, False


def _all_whole_events(run: list[bytes], envelope: _Envelope) -> bool:
    """Whether every read in `run` passes `_envelope_of` for `envelope`; the caller knows `run[0]`
    does. Each read's token is cut out as if it fitted, and the reads must equal the envelope put
    back around those tokens: joined, the two sides can only be equal if every read is at least
    as long as the envelope, so the reads line up one to one. Then no token may be empty, hold a
    newline (more than one event) or start with a quote (an empty string, then more JSON)."""
    prefix, suffix = envelope
    start, end = len(prefix), -len(suffix)
    tokens = [read[start:end] for read in run]
    if b"".join(run) != b"".join((prefix, (suffix + prefix).join(tokens), suffix)):
        return False
    inner = _SEP.join(tokens)
    return b"" not in tokens and inner.find(b"\n") < 0 and inner.find(_SEP + b'"') < 0
