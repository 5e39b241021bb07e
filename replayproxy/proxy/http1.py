"""HTTP/1.1 message heads for the forwarding path: hop-by-hop filtering, framing, proxy errors.

Header names and values pass through as received (case and order kept); only hop-by-hop fields
(RFC 9110 §7.6.1: Connection and the names it lists, Keep-Alive, Proxy-Connection, TE, Trailer,
Transfer-Encoding, Upgrade) and the framing fields this proxy re-decides are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus

Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
CHUNKED_END = b"0\r\n\r\n"
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


def connection_options(headers: Headers) -> frozenset[bytes]:
    """Lower-cased tokens of every Connection field."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b","))
    return frozenset(tokens)


def field_values(headers: Headers) -> dict[bytes, bytes]:
    """The first value of each field by lower-cased name, in one pass: the forwarding path looks a
    head up five or six times (framing, TE, Expect, Host, Upgrade, Content-Type), and a scan per
    lookup lower-cased every name each time."""
    values: dict[bytes, bytes] = {}
    for name, value in headers:
        values.setdefault(name.lower(), value)
    return values


def end_to_end(
    headers: Headers,
    framing: Headers,
    drop: frozenset[bytes] = frozenset(),
    values: dict[bytes, bytes] | None = None,
) -> Headers:
    """Headers minus hop-by-hop ones, those named in Connection and `drop` (lower-case names).

    The proxy's own `framing` fields (Content-Length or Transfer-Encoding) take the place of the
    message's framing field, with its name spelled as received when it is the same field, so a
    client sees the head in the order and case it would have seen without the proxy. `values`
    (field_values of the same head) spares the search for Connection fields when there are none.
    """
    options = connection_options(headers) if values is None or b"connection" in values else frozenset()
    removed = HOP_BY_HOP | options | drop if options or drop else HOP_BY_HOP
    out: Headers = []
    placed = not framing
    for name, value in headers:
        lower = name.lower()
        if lower in _FRAMING:
            if not placed:
                out.extend((name if f.lower() == lower else f, v) for f, v in framing)
                placed = True
        elif lower not in removed:
            out.append((name, value))
    if not placed:
        out.extend(framing)
    return out


def is_chunked(values: dict[bytes, bytes]) -> bool:
    """Whether a head (its field_values) is framed by the chunked coding."""
    value = values.get(b"transfer-encoding")
    return value is not None and value.rstrip().lower().endswith(b"chunked")


def serialize(start_line: bytes, headers: Headers, extra: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    lines = [start_line]
    lines.extend(n + b": " + v for n, v in headers)
    lines.extend(n + b": " + v for n, v in extra)
    lines.append(b"\r\n")
    return b"\r\n".join(lines)


def chunk(piece: bytes) -> bytes:
    """One chunk of the chunked transfer coding (RFC 9112 §7.1)."""
    return b"%x\r\n%b\r\n" % (len(piece), piece)


def error_response(status: int, *, close: bool) -> bytes:
    """A small plain-text answer the proxy itself gives (502, 504, 400, ...), like nginx's pages."""
    phrase = HTTPStatus(status).phrase.encode()
    body = b"%d %b\n" % (status, phrase)
    extra: Headers = [(b"Content-Type", b"text/plain; charset=utf-8"), (b"Content-Length", b"%d" % len(body))]
    if close:
        extra.append((b"Connection", b"close"))
    return serialize(b"HTTP/1.1 %d %b" % (status, phrase), [], extra) + body


def status_has_no_body(status: int, method: bytes) -> bool:
    """RFC 9110 §6.4.1: no content for HEAD, 1xx, 204 and 304 (2xx to CONNECT is refused earlier)."""
    return method == b"HEAD" or status < 200 or status in (204, 304)
