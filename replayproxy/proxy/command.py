"""`replayproxy proxy`: the sidecar recorder; settings: flags, REPLAYPROXY_PROXY_*, [proxy] of --config."""

from __future__ import annotations

import argparse

from replayproxy.proxy import settings

EXAMPLES = (
    "replayproxy proxy --upstream http://127.0.0.1:8000 --listen 0.0.0.0:8080 --trace-dir /traces",
    "replayproxy proxy --config config.example.toml --hash-key-file /etc/replayproxy/hash.key",
    "replayproxy proxy --upstream http://vllm:8000 --trace-dir /traces --sample-rate 0.1",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from replayproxy.proxy.server import run as serve

    return serve(settings.settings_from_args(args))
