"""`python -m replayproxy.sim` (and `replayproxy sim`): run the simulated engine until SIGINT/SIGTERM.

The first stdout line is `sim listening on http://HOST:PORT`, so callers that pass `--port 0` can
learn the ephemeral port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from replayproxy.sim.config import SimConfig, add_arguments, config_from_args
from replayproxy.sim.server import serving

EXAMPLES = (
    "replayproxy sim --port 8000",
    "replayproxy sim --port 8000 --no-prefix-cache --max-num-seqs 64 --speed 2",
    "replayproxy sim --config config.example.toml --api-key sk-test --fail-rate 0.01",
)


class _OneLineParser(argparse.ArgumentParser):
    """A bad option is one line and exit 2, like every replayproxy command (not usage + error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="replayproxy sim",
        description="Simulated OpenAI-compatible continuous-batching engine (vLLM-like) for tests and demos.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES),
    )
    add_arguments(parser)
    return parser


async def serve(config: SimConfig) -> None:
    """Serve until a signal asks to stop; in-flight requests get a short grace period."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(config) as url:
        print(f"sim listening on {url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as e:
        print(f"replayproxy sim: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
    except ImportError:  # uvloop is not available on every platform
        factory = None
    else:
        factory = uvloop.new_event_loop
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(config))
    except OSError as e:  # the port is taken, the address is not ours
        print(
            f"replayproxy sim: error: cannot listen on {config.host}:{config.port}: {e.strerror or e}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
