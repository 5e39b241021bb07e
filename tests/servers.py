"""Real servers on 127.0.0.1 for end-to-end tests (see replayproxy.launch), always stopped."""

from __future__ import annotations

import contextlib

from replayproxy.launch import Server, run_server

__all__ = ["Server", "run_server", "sim", "start_proxy"]


def sim(*options: str) -> contextlib.AbstractContextManager[Server]:
    """The simulated engine on an ephemeral loopback port."""
    return run_server(["replayproxy.sim", "--host", "127.0.0.1", "--port", "0", *options])


def start_proxy(
    upstream: str, trace_dir: object, *options: str, admin_listen: str = "127.0.0.1:0"
) -> contextlib.AbstractContextManager[Server]:
    """The sidecar proxy on an ephemeral loopback port (admin listener too, unless admin_listen="")."""
    return run_server(
        [
            "replayproxy",
            "proxy",
            "--upstream",
            upstream,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            admin_listen,
            "--trace-dir",
            str(trace_dir),
            *options,
        ]
    )
