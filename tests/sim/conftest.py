"""Fixtures for the sim tests: an in-process sim (own loop, own thread) with a truth log per test."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from replayproxy.sim import SimConfig
from replayproxy.sim.thread import sim_thread


@dataclasses.dataclass(frozen=True)
class RunningSim:
    url: str
    truth: Path
    config: SimConfig


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., RunningSim]]:
    """Start a sim on 127.0.0.1:0 with SimConfig overrides; all are stopped after the test."""
    counter = itertools.count()
    with contextlib.ExitStack() as stack:

        def start(**overrides: Any) -> RunningSim:
            truth = tmp_path / f"truth-{next(counter)}.jsonl"
            config = SimConfig(port=0, truth_log=str(truth), **overrides)
            return RunningSim(stack.enter_context(sim_thread(config)), truth, config)

        yield start
