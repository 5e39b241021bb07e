"""Message heads the proxy writes: the request head for the upstream, the response head for the client.

Pure functions over parsed fields, so the state machine in exchange.py only decides *what* to send.
The request target is rebased onto the upstream's path prefix after its dot-segments are removed
(RFC 3986 §5.2.4), so `/../admin` cannot climb out of the prefix; a target whose percent-encoded
dots would make a dot-segment is refused instead, since upstreams disagree on decoding them.
"""

from __future__ import annotations

from dataclasses import dataclass

from replayproxy.proxy import http1

_DROP_REQUEST = frozenset({b"expect"})


class BadTarget(ValueError):
    """A request target (or Host) the proxy refuses (400) rather than forward."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """What every request head for one upstream shares."""

    prefix: bytes  # path of the upstream URL without its trailing slash, e.g. b"/api/v1" or b""
    host: bytes  # Host for requests that had none (HTTP/1.0)


def check_host(headers: http1.Headers, values: dict[bytes, bytes], version: bytes) -> None:
    """RFC 9112 §3.2: an HTTP/1.1 request without Host, or any request with more than one Host
    field, gets 400 (HTTP/1.0 predates Host: the upstream's own is sent for it)."""
    if b"host" not in values:
        if version == b"1.1":
            raise BadTarget("no Host")
    elif sum(1 for name, _ in headers if len(name) == 4 and name.lower() == b"host") > 1:
        raise BadTarget("more than one Host")


def origin_form(target: bytes) -> bytes:
    """Path and query of a target; absolute-form (`http://h/p?q`) keeps only those."""
    if target[:1] == b"/" or target == b"*":
        return target
    scheme_end = target.find(b"://")
    slash = target.find(b"/", scheme_end + 3) if scheme_end >= 0 else -1
    return target[slash:] if slash >= 0 else b"/"


def remove_dot_segments(path: bytes) -> bytes:
    """RFC 3986 §5.2.4 for an absolute path: `.` and `..` resolved, never above the root."""
    segments = path.split(b"/")[1:]
    out: list[bytes] = []
    for segment in segments:
        if segment == b"..":
            if out:
                out.pop()
        elif segment != b".":
            out.append(segment)
    if segments and segments[-1] in (b".", b".."):
        out.append(b"")  # `/a/b/..` is the directory `/a/`
    return b"/" + b"/".join(out)


def rebase(target: bytes, prefix: bytes) -> bytes:
    """The target the upstream sees: origin-form, dot-segments removed when a prefix is added."""
    target = origin_form(target)
    if not prefix:
        return target  # like nginx's proxy_pass without a URI: passed as received
    path, mark, query = target.partition(b"?")
    if b"%2" in path:
        decoded = path.replace(b"%2e", b".").replace(b"%2E", b".")
        if any(s in (b".", b"..") for s in decoded.split(b"/")):
            raise BadTarget("percent-encoded dot-segment")
    if b"/." in path:
        path = remove_dot_segments(path)
    if path == b"*":
        path = b"/"
    return prefix + path + mark + query


def request_head(
    method: bytes,
    target: bytes,
    headers: http1.Headers,
    values: dict[bytes, bytes],
    upstream: Upstream,
    *,
    length: int | None,
    chunked: bool,
    upgrade: bool,
    forwarded: http1.Headers,
) -> bytes:
    """The head sent upstream: end-to-end fields as received, the proxy's framing and hop fields;
    `values` is http1.field_values(headers)."""
    extra = forwarded
    if b"host" not in values:
        extra.append((b"Host", upstream.host))
    framing: http1.Headers = []
    if length is not None:
        framing.append((b"Content-Length", b"%d" % length))
    elif chunked:
        framing.append((b"Transfer-Encoding", b"chunked"))
    if upgrade:  # offered upstream only for a request with no body: the 101 decides (RFC 9110 §7.8)
        extra.append((b"Connection", b"upgrade"))
        extra.append((b"Upgrade", values.get(b"upgrade", b"")))
    start = b"%b %b HTTP/1.1" % (method, target)
    return http1.serialize(start, http1.end_to_end(headers, framing, _DROP_REQUEST, values), extra)


def response_head(
    status: int,
    reason: bytes,
    headers: http1.Headers,
    values: dict[bytes, bytes],
    framing: http1.Headers,
    connection: bytes,
) -> bytes:
    """The head sent to the client; `connection` is b"close", b"keep-alive" (HTTP/1.0) or b"".
    The status line carries the proxy's own version, HTTP/1.1, whatever the client's minor version
    (RFC 9110 §6.2: the highest minor version the server conforms to; nginx answers HTTP/1.0
    clients the same way); framing stays what an HTTP/1.0 client reads (no chunked coding)."""
    extra = [(b"Connection", connection)] if connection else []
    start = b"HTTP/1.1 %d %b" % (status, reason)
    return http1.serialize(start, http1.end_to_end(headers, framing, values=values), extra)


def switching_head(reason: bytes, headers: http1.Headers) -> bytes:
    """A 101 passes on with its Upgrade and Connection fields: they are the switch itself."""
    return http1.serialize(b"HTTP/1.1 101 %b" % reason, headers)


def is_event_stream(values: dict[bytes, bytes]) -> bool:
    return values.get(b"content-type", b"").lower().startswith(b"text/event-stream")


def trailer_block(trailers: http1.Headers) -> bytes:
    """The last chunk with the trailer fields (RFC 9112 §7.1.2), framing fields left out."""
    kept = http1.end_to_end(trailers, [], frozenset({b"content-length"}))
    return http1.serialize(b"0", kept)
