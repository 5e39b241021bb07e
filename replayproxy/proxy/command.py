"""`replayproxy proxy`: the sidecar recorder; settings: flags, REPLAYPROXY_PROXY_*, [proxy] of --config."""

from __future__ import annotations

import argparse

from replayproxy.proxy import settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from replayproxy.proxy.server import run as serve

    return serve(settings.settings_from_args(args))
