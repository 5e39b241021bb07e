"""The proxy's settings: one frozen dataclass filled from `[proxy]` in TOML, `REPLAYPROXY_PROXY_*`, and flags.

Command-line options are generated from the fields, so the file, the environment and the flags
can never disagree about names; `config.example.toml` documents every field in the same order.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayproxy.config import ConfigError, build, http_url, read_toml
from replayproxy.errors import BadOption
from replayproxy.shape import ENDPOINTS
from replayproxy.trace import storage

FORWARDED_MODES = ("none", "x-forwarded-for", "forwarded", "both")


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """Everything `replayproxy proxy` can be told; times in seconds, sizes in bytes."""

    upstream: str = _opt("", "base URL of the inference server, e.g. http://127.0.0.1:8000 (required)")
    listen: str = _opt("0.0.0.0:8080", "HOST:PORT the proxy accepts clients on (port 0: any free port)")
    admin_listen: str = _opt("127.0.0.1:9464", "HOST:PORT of /metrics, /healthz and /readyz ('' to disable)")
    upstream_health_path: str = _opt(
        "/health", "path /readyz asks the upstream (after the upstream URL's path); a status < 500 is ready"
    )
    ready_requires_recording: bool = _opt(
        False, "/readyz also fails while recording falls behind (off: recording never takes the proxy out)"
    )
    trace_dir: Path | None = _opt(None, "directory for trace files (required when record is on)")
    record: bool = _opt(True, "record request shapes; off makes a plain transparent proxy")
    sample_rate: float = _opt(1.0, "fraction of eligible requests recorded, 0..1")
    include_endpoints: tuple[str, ...] = _opt(
        ("chat", "completions", "embeddings"),
        "endpoint classes recorded: chat, completions, embeddings, other",
    )
    exclude_endpoints: tuple[str, ...] = _opt((), "endpoint classes never recorded (applied after include)")
    inject_usage: bool = _opt(True, "ask streaming upstreams for usage, hiding the extra chunk from clients")
    hash_key_file: Path | None = _opt(None, "file with the prefix-hash key (created 0600 if missing)")
    tokenizer: Path | None = _opt(None, "tokenizer.json or .gguf: hash token blocks, not character blocks")
    block_size: int = _opt(0, "prefix-hash block size in the unit used (0: 16 tokens or 64 characters)")
    allow_small_blocks: bool = _opt(
        False, "accept a block_size under 16 tokens or 64 characters (a key holder can guess short blocks)"
    )
    forwarded_headers: str = _opt(
        "none", "add client address headers: none, x-forwarded-for, forwarded, both"
    )
    connect_timeout_s: float = _opt(5.0, "upstream connect timeout; past it the client gets 504")
    first_byte_timeout_s: float = _opt(600.0, "request sent -> response headers; past it 504")
    idle_timeout_s: float = _opt(600.0, "longest silence between response chunks before the stream is cut")
    total_timeout_s: float = _opt(0.0, "whole-exchange limit (0: none)")
    max_upstream_connections: int = _opt(1024, "open upstream connections at most; more requests wait")
    max_idle_upstream_connections: int = _opt(256, "idle keep-alive upstream connections kept")
    upstream_keepalive_s: float = _opt(4.0, "idle upstream connections are closed after this")
    client_keepalive_s: float = _opt(75.0, "idle client connections are closed after this")
    client_header_timeout_s: float = _opt(60.0, "a client must send a whole request head within this")
    max_request_head_bytes: int = _opt(65536, "larger request heads get 431")
    max_response_head_bytes: int = _opt(65536, "larger upstream response heads get 502")
    max_client_connections: int = _opt(4096, "open client connections at most; more get 503 at once")
    max_buffered_body_bytes: int = _opt(16 << 20, "request bodies up to this are parsed for recording")
    max_captured_response_bytes: int = _opt(16 << 20, "response bytes kept per request for recording")
    queue_records: int = _opt(4096, "requests waiting for the recorder at most; more are dropped")
    queue_bytes: int = _opt(256 << 20, "bytes waiting for the recorder at most; more are dropped")
    recorder_cpus: str = _opt(
        "", "CPUs the recorder process runs on, e.g. 1 or 2-3,6 ('': the CPUs the proxy may run on)"
    )
    flush_interval_s: float = _opt(1.0, "a trace frame is cut at least this often")
    rotate_bytes: int = _opt(256 << 20, "start a new trace file past this size (0: never)")
    rotate_s: float = _opt(3600.0, "start a new trace file after this age (0: never)")
    retain_files: int = _opt(0, "keep at most this many trace files, deleting the oldest (0: all)")
    retain_bytes: int = _opt(0, "keep at most this many bytes of trace files (0: no limit)")
    file_prefix: str = _opt("trace", "trace file names are PREFIX-<UTC time>-<seq>.rpt")
    upload_url: str = _opt(
        "", "object-store URL prefix rotated trace files go to, e.g. s3://bucket/traces ('': keep local)"
    )
    pod_name: str = _opt("", "pod name in upload paths ('': $POD_NAME, else $HOSTNAME)")
    upload_retry_s: float = _opt(1.0, "first retry of a failed upload after this; doubles up to 60 s")
    upload_drain_s: float = _opt(10.0, "on shutdown, keep uploading for at most this long")
    drain_timeout_s: float = _opt(30.0, "on SIGTERM, wait this long for in-flight requests")
    retry_s: float = _opt(5.0, "after a recording failure, try writing again after this")
    log_interval_s: float = _opt(60.0, "a repeated failure is logged at most once per interval")
    backlog: int = _opt(2048, "listen backlog")

    def __post_init__(self) -> None:
        if not self.upstream:
            raise BadOption("upstream is required (--upstream URL)")
        http_url(self.upstream, "upstream")
        if self.record and self.trace_dir is None:
            raise BadOption("trace_dir is required when recording (--trace-dir DIR, or --no-record)")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise BadOption(f"sample_rate must be within [0, 1], got {self.sample_rate}")
        for name in ("include_endpoints", "exclude_endpoints"):
            unknown = set(getattr(self, name)) - set(ENDPOINTS)
            if unknown:
                raise BadOption(f"{name}: unknown {sorted(unknown)}; valid: {', '.join(ENDPOINTS)}")
        if self.forwarded_headers not in FORWARDED_MODES:
            raise BadOption(f"forwarded_headers must be one of {', '.join(FORWARDED_MODES)}")
        parse_hostport(self.listen, "listen")
        if self.upload_url:
            if not storage.is_url(self.upload_url):
                raise BadOption(f"upload_url must be an object-store URL (s3://...), got {self.upload_url!r}")
            storage.filesystem(self.upload_url)  # a store whose client is missing: one line, at start
        parse_cpus(self.recorder_cpus, "recorder_cpus")
        if self.admin_listen:
            parse_hostport(self.admin_listen, "admin_listen")
        path = self.upstream_health_path
        if not path.startswith("/") or not path.isprintable() or " " in path:
            raise BadOption(f"upstream_health_path must be a path starting with /, got {path!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                _check_number(f.name, value)
        unit = "token" if self.tokenizer is not None else "char"
        if 0 < self.block_size < MIN_BLOCK[unit] and not self.allow_small_blocks:
            raise BadOption(
                f"block_size {self.block_size} is under {MIN_BLOCK[unit]} {unit}s: a holder of the hash key "
                "could recover short blocks by guessing; pass --allow-small-blocks to accept that"
            )
        positive = (
            "connect_timeout_s",
            "first_byte_timeout_s",
            "idle_timeout_s",
            "max_upstream_connections",
            "queue_records",
            "flush_interval_s",
            "drain_timeout_s",
            "max_request_head_bytes",
            "max_response_head_bytes",
            "max_client_connections",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise BadOption(f"{name} must be > 0, got {getattr(self, name)}")

    @property
    def endpoints_recorded(self) -> frozenset[str]:
        return frozenset(self.include_endpoints) - frozenset(self.exclude_endpoints)


# The smallest prefix-hash block (per unit) whose content cannot be found by trying guesses
# against the hashes, for whoever holds the key (README, "Privacy").
MIN_BLOCK = {"token": 16, "char": 64}

# Upper bounds past which a setting is a mistake, not a choice: a timeout past a month (an
# infinite one overflowed the timer arithmetic and stopped every timeout), counts and sizes past
# what one process can hold. Each is far beyond any deployment's need.
MAX_SECONDS = 30 * 86400.0
_MAX_BY_NAME: dict[str, int] = {
    "backlog": 65535,
    "max_upstream_connections": 1_000_000,
    "max_idle_upstream_connections": 1_000_000,
    "queue_records": 100_000_000,
    "block_size": 1_000_000,
    "max_request_head_bytes": 1 << 30,
    "max_response_head_bytes": 1 << 30,
    "max_client_connections": 1_000_000,
    "max_buffered_body_bytes": 1 << 40,
    "max_captured_response_bytes": 1 << 40,
    "queue_bytes": 1 << 40,
}
_MAX_COUNT = 1 << 53  # any other count or size (retention, rotation): exact as a float, and absurd past it


def _check_number(name: str, value: float) -> None:
    """A number setting is finite, not negative, and within its bound; the error names it."""
    if not math.isfinite(value):
        raise BadOption(f"{name} must be a finite number, got {value}")
    if value < 0:
        raise BadOption(f"{name} must be >= 0, got {value}")
    limit = MAX_SECONDS if name.endswith("_s") else _MAX_BY_NAME.get(name, _MAX_COUNT)
    if value > limit:
        raise BadOption(f"{name} must be at most {limit:g}, got {value:g}")


def parse_hostport(text: str, name: str) -> tuple[str, int]:
    """'HOST:PORT' or '[v6]:PORT' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise BadOption(f"{name} must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def parse_cpus(text: str, name: str) -> frozenset[int]:
    """'1', '2-3,6' -> CPU numbers; '' -> none (no placement asked for)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or int(high if dash else low) < int(low):
            raise BadOption(f"{name} must be CPU numbers or ranges like 1 or 2-3,6, got {text!r}")
        cpus.update(range(int(low), int(high if dash else low) + 1))
    if cpus and max(cpus) >= (os.cpu_count() or 1):
        count = os.cpu_count() or 1
        raise BadOption(f"{name}: CPU {max(cpus)} does not exist here ({count} CPUs: 0-{count - 1})")
    return frozenset(cpus)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; defaults stay None so the file and environment can fill the gaps."""
    parser.add_argument("--config", metavar="FILE", help="TOML file; settings under [proxy] (default: none)")
    hints = typing.get_type_hints(ProxySettings)
    for f in dataclasses.fields(ProxySettings):
        flag = "--" + f.name.replace("_", "-")
        text = f.metadata["help"]
        text = text if "(required)" in text else f"{text} (default: {_show(f.default) or 'none'})"
        if hints[f.name] is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, default=None, metavar=f.name.split("_")[-1].upper(), help=text)


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ProxySettings:
    """Defaults < `[proxy]` of --config < REPLAYPROXY_PROXY_* < flags."""
    file_values = read_toml(args.config).get("proxy", {}) if args.config else {}
    if not isinstance(file_values, dict):
        raise ConfigError(f"{args.config}: [proxy] must be a table")
    overrides = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(ProxySettings)}
    return build(
        ProxySettings, section="proxy", file_values=file_values, environ=environ, overrides=overrides
    )
