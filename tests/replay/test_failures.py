"""Recorded failures are left out of a replay unless asked for, and the header counts them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from replayproxy.replay import options as replay_options
from replayproxy.replay import preparation
from replayproxy.shape import RequestShape
from replayproxy.sim.config import SimConfig
from replayproxy.sim.server import serving
from tests.replay import traces


def test_recorded_failures_are_left_out_unless_included(tmp_path: Path) -> None:
    errors = ["", "http_4xx", "", "http_5xx", "client_cancel", "timeout"]
    shapes = [
        RequestShape(offset_ns=i * 1_000_000, model=traces.SIM_MODEL, input_tokens=40, output_tokens=3,
                     roles="u", error=error, status=400 if error == "http_4xx" else 200)
        for i, error in enumerate(errors)
    ]  # fmt: skip
    path = traces.write(tmp_path / "t.rpt", shapes)

    async def main(include: bool) -> preparation.RunPlan:
        async with serving(SimConfig(port=0)) as url:
            options = replay_options.ReplayOptions(
                target=url, output=str(tmp_path / "r.rpr"), traces=(str(path),), include_failed=include
            )
            return await preparation.prepare_run(options)

    default = asyncio.run(main(False))
    assert default.schedule.trace_index[default.send].tolist() == [0, 2, 4]
    assert default.pre_run["recorded_failures_left_out"] == 3
    included = asyncio.run(main(True))
    assert included.requests == 6 and included.pre_run["recorded_failures_left_out"] == 0
