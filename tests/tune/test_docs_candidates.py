"""The candidates files the docs show load, and each configuration passes the fit check or says why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from replayproxy.tune.candidates import load_candidates
from replayproxy.tune.fit import TraceFacts, check_fit

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tune"


@pytest.mark.parametrize("name", ["vllm.toml", "sglang.toml", "sim.toml", "llamacpp.toml"])
def test_documented_candidates_files_load(name: str) -> None:
    engines = load_candidates(DOCS / name)
    facts = TraceFacts(requests=1000, span_s=600.0, longest_tokens=8192, mean_tokens=1500.0)
    configs = [c for e in engines for c in e.configurations()]
    assert configs and all(e.launched for e in engines)
    for config in configs:
        assert not any("{" in argument for argument in config.argv(8000))  # every placeholder is filled
        fit = check_fit(config, facts)
        assert not fit.pruned, f"{config.label}: {fit.pruned}"
