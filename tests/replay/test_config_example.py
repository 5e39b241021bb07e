"""The [replay] section of config.example.toml is valid: every key exists and has the right type."""

from __future__ import annotations

from pathlib import Path

from replayproxy import config
from replayproxy.replay.options import ReplayOptions

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


def test_the_example_replay_section_builds_the_options() -> None:
    section = config.read_toml(EXAMPLE)["replay"]
    options = config.build(ReplayOptions, section="replay", file_values=section, environ={})
    assert options.target == "http://127.0.0.1:8000" and options.speed == 1.0
    assert options.model_map == {"llama-3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct"}
    assert options.scrape_interval == 0.25 and options.reset_prefix_cache is True
