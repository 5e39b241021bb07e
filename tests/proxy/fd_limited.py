"""`python -m tests.proxy.fd_limited N ARGS...`: the replayproxy CLI with at most N file descriptors
(soft and hard), so a test can run the proxy out of them without touching its own process."""

from __future__ import annotations

import resource
import sys

from replayproxy.cli import main

if __name__ == "__main__":
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    raise SystemExit(main(sys.argv[2:]))
