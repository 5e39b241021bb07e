"""A simulated OpenAI-compatible continuous-batching engine: the test double for real servers.

It imports nothing from the rest of replayproxy, because it must not share the code it helps test.
Library use: `make_app(SimConfig(...))` for an in-process aiohttp app, or `serving(config)` to run
it on a socket; `python -m replayproxy.sim --help` for the command line. See docs/sim.md.
"""

from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import SIM, Sim, make_app, serving

__all__ = ["SIM", "Sim", "SimConfig", "make_app", "serving"]
