"""Real servers on 127.0.0.1 for end-to-end tests (see replayproxy.launch), always stopped."""

from __future__ import annotations

import contextlib

from replayproxy.launch import Server, run_server

__all__ = ["Server", "run_server", "sim"]


def sim(*options: str) -> contextlib.AbstractContextManager[Server]:
    """The simulated engine on an ephemeral loopback port."""
    return run_server(["replayproxy.sim", "--host", "127.0.0.1", "--port", "0", *options])
