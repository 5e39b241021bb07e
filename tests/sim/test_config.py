import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from replayproxy.sim.config import SimConfig, add_arguments, config_from_args, load_toml
from tests.sim.conftest import RunningSim
from tests.sim.helpers import get


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_overrides_toml_which_overrides_defaults(tmp_path: Path) -> None:
    path = tmp_path / "sim.toml"
    path.write_text('speed = 4\nmodel = "toml-model"\nprefix-cache = false\ntokens_per_chunk = 3\n')
    config = config_from_args(_args("--config", str(path), "--tokens-per-chunk", "5"))
    assert config.speed == 4.0 and isinstance(config.speed, float)
    assert config.model == "toml-model" and not config.prefix_cache and config.tokens_per_chunk == 5
    assert config.max_num_seqs == SimConfig().max_num_seqs


def test_boolean_options_have_no_forms() -> None:
    assert not config_from_args(_args("--no-prefix-cache")).prefix_cache
    assert config_from_args(_args("--split-writes")).split_writes


@pytest.mark.parametrize(
    "text, message",
    [
        ("bogus = 1", "unknown key 'bogus'"),
        ('speed = "fast"', "must be float"),
        ("split_writes = 1", "must be bool"),
        ("speed = [", "bad.toml"),
    ],
)
def test_bad_toml_is_a_value_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_toml(path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("speed", 0.0),
        ("fail_rate", 1.5),
        ("tokens_per_chunk", 0),
        ("step_base_ms", -1.0),
        ("port", 70000),
        ("max_model_len", 10**9),
    ],
)
def test_invalid_values_are_rejected(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SimConfig(**{field: value})  # type: ignore[arg-type]


def test_the_shared_config_file_gives_the_sim_its_own_section(tmp_path: Path) -> None:
    shared = tmp_path / "shared.toml"
    shared.write_text('[proxy]\nupstream = "http://x"\n[sim]\nport = 9100\nmax-model-len = 4096\n')
    assert load_toml(shared) == {"port": 9100, "max_model_len": 4096}
    example = Path(__file__).resolve().parents[2] / "config.example.toml"
    config = config_from_args(_args("--config", str(example)))
    assert (config.host, config.port, config.model) == ("127.0.0.1", 8000, "sim-llama-3.1-8b")


def test_an_api_key_is_required_on_v1_routes_only(start_sim: Callable[..., RunningSim]) -> None:
    sim = start_sim(api_key="k-123")
    assert get(f"{sim.url}/v1/models")[0] == 401
    assert get(f"{sim.url}/health")[0] == 200
    status, body = asyncio.run(_get_with(f"{sim.url}/v1/models", {"Authorization": "Bearer k-123"}))
    assert status == 200 and b"sim-llama-3.1-8b" in body


async def _get_with(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        return resp.status, await resp.read()
