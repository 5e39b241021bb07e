"""Proxy settings: flags over environment over file over defaults, clear errors, a complete example file."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

import pytest

from replayproxy.config import ConfigError, read_toml
from replayproxy.errors import BadOption
from replayproxy.proxy.settings import ProxySettings, add_arguments, parse_cpus, settings_from_args

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


def parse(argv: list[str], environ: dict[str, str] | None = None) -> ProxySettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(argv), environ=environ or {})


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[proxy]\nupstream = "http://file:1"\nsample-rate = 0.5\nidle_timeout_s = 9\ntrace_dir = "t"\n'
        "[replay]\nignored = true\n"
    )
    s = parse(
        ["--config", str(config), "--sample-rate", "0.25", "--no-inject-usage"],
        {"REPLAYPROXY_PROXY_IDLE_TIMEOUT_S": "7", "REPLAYPROXY_PROXY_INCLUDE_ENDPOINTS": "chat,other"},
    )
    assert (s.upstream, s.sample_rate, s.idle_timeout_s, s.inject_usage) == (
        "http://file:1",
        0.25,
        7.0,
        False,
    )
    assert s.include_endpoints == ("chat", "other") and s.trace_dir == Path("t")
    assert s.connect_timeout_s == 5.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "upstream is required"),
        (["--upstream", "ftp://x"], "http:// or https://"),
        (["--upstream", "http://x"], "trace_dir is required"),
        (["--upstream", "http://x", "--no-record", "--sample-rate", "2"], "sample_rate"),
        (["--upstream", "http://x", "--no-record", "--listen", "nowhere"], "listen must be HOST:PORT"),
        (["--upstream", "http://x", "--no-record", "--include-endpoints", "chat,bogus"], "valid: chat"),
        (["--upstream", "http://x", "--no-record", "--forwarded-headers", "all"], "forwarded_headers"),
        (["--upstream", "http://x", "--no-record", "--idle-timeout-s", "-1"], "idle_timeout_s"),
        (["--upstream", "http://x", "--no-record", "--backlog", "many"], "--backlog"),
        (["--upstream", "http://x", "--no-record", "--recorder-cpus", "one"], "recorder_cpus must be CPU"),
        (["--upstream", "http://x", "--no-record", "--recorder-cpus", "3-1"], "recorder_cpus must be CPU"),
        (["--upstream", "http://x", "--no-record", "--recorder-cpus", "0,-2"], "recorder_cpus must be CPU"),
        (["--upstream", "http://x", "--no-record", "--recorder-cpus", "99999"], "CPU 99999 does not exist"),
    ],
)
def test_bad_settings_are_one_clear_error(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(argv)


def test_unknown_keys_are_refused_with_the_valid_names(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[proxy]\nupstreem = "http://x"\n')
    with pytest.raises(ConfigError, match="unknown setting \\[proxy\\] upstreem; valid: admin_listen"):
        parse(["--config", str(config)])
    with pytest.raises(ConfigError, match="REPLAYPROXY_PROXY_UPSTREAM"):
        parse(["--upstream", "http://x", "--no-record"], {"REPLAYPROXY_PROXY_UPSTREEM": "1"})


def test_the_example_file_documents_every_setting_and_loads() -> None:
    text = EXAMPLE.read_text()
    section = text.split("[proxy]", 1)[1].split("\n[", 1)[0]
    documented = re.findall(r"^#? ?([a-z_]+) = .*#", section, re.MULTILINE)
    names = [f.name for f in dataclasses.fields(ProxySettings)]
    assert documented == names  # every key, in the dataclass order, each with a comment
    s = parse(["--config", str(EXAMPLE)])
    defaults = {n: getattr(s, n) for n in names if n not in ("upstream", "trace_dir")}
    assert defaults == {n: f.default for f in dataclasses.fields(ProxySettings) if (n := f.name) in defaults}
    assert set(read_toml(EXAMPLE)) >= {"proxy"}


NUMBERS = [
    f.name
    for f in dataclasses.fields(ProxySettings)
    if f.type in ("int", "float") and f.name != "sample_rate"
]


@pytest.mark.parametrize("name", NUMBERS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "1e300", "99999999999999999999"])
def test_infinite_negative_and_absurd_numbers_are_refused_naming_the_option(name: str, value: str) -> None:
    """An infinite timeout used to be accepted and then crashed the task behind every timeout."""
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError) as refused:
        parse(["--upstream", "http://x", "--no-record", f"{flag}={value}"])
    message = str(refused.value)
    assert (name in message or flag in message) and "\n" not in message


def test_small_hash_blocks_need_an_explicit_yes() -> None:
    with pytest.raises(ConfigError, match="block_size 4 is under 64 chars.*--allow-small-blocks"):
        parse(["--upstream", "http://x", "--trace-dir", "t", "--block-size", "4"])
    with pytest.raises(ConfigError, match="under 16 tokens"):
        parse(["--upstream", "http://x", "--trace-dir", "t", "--block-size", "8", "--tokenizer", "tok.json"])
    assert parse(["--upstream", "http://x", "--trace-dir", "t", "--block-size", "64"]).block_size == 64
    small = parse(["--upstream", "http://x", "--trace-dir", "t", "--block-size", "1", "--allow-small-blocks"])
    assert small.block_size == 1


def test_recorder_cpus_are_numbers_and_ranges() -> None:
    assert parse_cpus("", "recorder_cpus") == frozenset()
    assert parse_cpus("0", "recorder_cpus") == {0}
    last = (os.cpu_count() or 1) - 1
    assert parse_cpus(f"0-{last}, {last}", "recorder_cpus") == set(range(last + 1))


def test_the_upstream_health_path_must_be_a_path() -> None:
    for bad in ("health", "/he alth", "/health\r\nX: y"):
        with pytest.raises(BadOption, match="upstream_health_path must be a path starting with /"):
            parse(["--upstream", "http://u:1", "--no-record", "--upstream-health-path", bad])
    assert (
        parse(
            ["--upstream", "http://u:1", "--no-record", "--upstream-health-path", "/v1/models"]
        ).upstream_health_path
        == "/v1/models"
    )
