"""The candidates file: parsing, placeholders, search spaces, and one-line errors for every mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replayproxy.config import ConfigError
from replayproxy.tune.candidates import fill, load_candidates, parse_candidates

SIM = "python -m replayproxy.sim --port {port} --max-num-seqs {max_num_seqs} --max-num-batched-tokens {mnbt}"


def _one(**engine: Any) -> dict[str, Any]:
    return {"engine": [{"name": "e", **engine}]}


def test_a_grid_expands_in_file_order_and_fills_the_command() -> None:
    (engine,) = parse_candidates(
        _one(command=SIM, grid={"max_num_seqs": [64, 128], "mnbt": [2048, 8192]}, env={"X": "{port}"}), "c"
    )
    configs = list(engine.configurations())
    assert [c.key for c in configs] == [
        "max_num_seqs=64,mnbt=2048",
        "max_num_seqs=64,mnbt=8192",
        "max_num_seqs=128,mnbt=2048",
        "max_num_seqs=128,mnbt=8192",
    ]
    assert configs[1].argv(9001) == (
        "python -m replayproxy.sim --port 9001 --max-num-seqs 64 --max-num-batched-tokens 8192".split()
    )
    assert configs[1].environment(9001) == {"X": "9001"}
    assert configs[1].directory_name == "max_num_seqs-64_mnbt-8192"


def test_braces_that_are_not_placeholders_are_left_alone() -> None:
    assert fill("serve --compilation-config '{\"level\": 3}' --port {port}", {"port": "1"}) == (
        "serve --compilation-config '{\"level\": 3}' --port 1"
    )


def test_the_command_is_split_once_and_each_value_fills_only_its_own_argument() -> None:
    hostile = ["two words", 'it\'s "quoted"', "a; rm -rf x", "a && touch pwned", "$(id)", "`id`", "", "'"]
    command = "serve --port {port} --value {v} --flag=pre{v}post '--json={\"k\": {v}}'"
    (engine,) = parse_candidates(_one(command=command, grid={"v": hostile}), "c")
    for config, value in zip(engine.configurations(), hostile, strict=True):
        assert config.argv(7) == [
            "serve", "--port", "7", "--value", value, f"--flag=pre{value}post", '--json={"k": ' + value + "}"
        ]  # fmt: skip


def test_a_url_engine_is_one_configuration_measured_as_is() -> None:
    (engine,) = parse_candidates(_one(url="http://127.0.0.1:8000/"), "c")
    (config,) = engine.configurations()
    assert engine.url == "http://127.0.0.1:8000" and not engine.launched
    assert config.key == "as-is" and config.label == "e"


def test_one_at_a_time_starts_from_the_baseline() -> None:
    (engine,) = parse_candidates(
        _one(
            command=SIM,
            strategy="one-at-a-time",
            grid={"max_num_seqs": [64, 128, 256], "mnbt": [2048, 8192]},
            baseline={"max_num_seqs": 128, "mnbt": 8192},
        ),
        "c",
    )
    base = engine.baseline_config()
    assert base.key == "max_num_seqs=128,mnbt=8192"
    assert base.with_knob("mnbt", 2048).key == "max_num_seqs=128,mnbt=2048"


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({}, "exactly one of 'url'"),
        ({"url": "http://h", "command": SIM}, "exactly one of 'url'"),
        ({"url": "http://h", "grid": {"a": [1]}}, "a 'grid' needs a 'command'"),
        ({"command": "serve --max-num-seqs {max_num_seqs}", "grid": {"max_num_seqs": [1]}}, "{port}"),
        ({"command": SIM, "grid": {"max_num_seqs": [1]}}, "{mnbt}, which is not a grid knob"),
        (
            {"command": SIM, "grid": {"max_num_seqs": [1], "mnbt": [1], "extra": [1]}},
            "'extra' does not appear",
        ),
        ({"command": SIM, "grid": {"max_num_seqs": [], "mnbt": [1]}}, "non-empty list"),
        ({"command": SIM, "grid": {"max_num_seqs": [1, 1], "mnbt": [1]}}, "lists a value twice"),
        ({"command": SIM, "grid": {"max_num_seqs": [[1]], "mnbt": [1]}}, "numbers, strings or booleans"),
        (
            {"command": SIM, "grid": {"max_num_seqs": [1], "mnbt": [1]}, "strategy": "random"},
            "strategy must be",
        ),
        (
            {"command": SIM, "grid": {"max_num_seqs": [1], "mnbt": [1]}, "strategy": "one-at-a-time"},
            "give baseline.max_num_seqs",
        ),
        (
            {"command": SIM, "grid": {"max_num_seqs": [1], "mnbt": [1]}, "baseline": {"z": 1}},
            "not in the grid",
        ),
        ({"url": "http://h", "start_timeout": float("inf")}, "'start_timeout' must be a positive number"),
        ({"url": "http://h", "stop_timeout": -1}, "'stop_timeout' must be a positive number"),
        ({"url": "http://h", "health": "health"}, "starting with '/'"),
        ({"url": "http://h", "replay_args": "--model m"}, "list of strings"),
        ({"url": "http://h", "capacity": {"model": "llama-3.1-8b"}}, "both 'model' and 'gpu_memory'"),
        ({"url": "http://h", "colour": "red"}, "unknown key(s) colour"),
        ({"url": "http://h", "restart_between_runs": True}, "needs a 'command' to start the engine again"),
        ({"command": "serve --port {port}", "restart_between_runs": "yes"}, "must be true or false"),
    ],
)
def test_every_mistake_is_one_line_naming_the_engine(engine: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_candidates(_one(**engine), "c.toml")
    assert message in str(e.value) and "engine 'e'" in str(e.value) and "\n" not in str(e.value)


def test_file_level_mistakes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no \\[\\[engine\\]\\] table"):
        parse_candidates({}, "c.toml")
    with pytest.raises(ConfigError, match="used twice: a"):
        parse_candidates(
            {"engine": [{"name": "a", "url": "http://h"}, {"name": "a", "url": "http://i"}]}, "c"
        )
    for name in ("a b", "..", ".", ".hidden", "a/b", "/abs", "", "-rf", "x" * 65):
        with pytest.raises(ConfigError, match="'name' must start with a letter or digit"):
            parse_candidates({"engine": [{"name": name, "url": "http://h"}]}, "c")
    with pytest.raises(ConfigError, match="'command' cannot be split into arguments"):
        parse_candidates({"engine": [{"name": "a", "command": "serve --port {port} 'unclosed"}]}, "c")
    bad = tmp_path / "c.toml"
    bad.write_text("[[engine]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_candidates(bad)
    with pytest.raises(ConfigError, match="cannot read candidates file"):
        load_candidates(tmp_path / "missing.toml")
