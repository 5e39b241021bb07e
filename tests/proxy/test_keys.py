"""The hash key file: created private, shared when present, refused when weak."""

from __future__ import annotations

import secrets
import stat
from pathlib import Path

import pytest

from replayproxy.config import ConfigError
from replayproxy.proxy.keys import load_key


def test_key_file_is_created_0600_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "hash.key"
    key = load_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(path) == key and len(key) == 64


def test_random_key_without_a_file_and_short_keys_refused(tmp_path: Path) -> None:
    assert load_key(None) != load_key(None)
    weak = tmp_path / "weak.key"
    weak.write_text("short\n")
    with pytest.raises(ConfigError, match="too short"):
        load_key(weak)
    long = tmp_path / "long.key"
    long.write_text(secrets.token_hex(50))
    assert len(load_key(long)) == 64


@pytest.mark.parametrize(
    "text",
    [
        "replace-with-32-random-bytes-in-hex",  # the example manifest's old value
        "CHANGE_ME_CHANGE_ME_CHANGE_ME_CHANGE_ME",
        "0" * 64,
        "abababababababababababababababababab",
    ],
)
def test_a_placeholder_key_is_refused_without_showing_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "hash.key"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match="the key is a placeholder, not a random key; generate one") as e:
        load_key(path)
    assert text not in str(e.value)


def test_a_16_byte_key_is_too_short_now(tmp_path: Path) -> None:
    path = tmp_path / "hash.key"
    path.write_text(secrets.token_hex(8))
    with pytest.raises(ConfigError, match=r"key too short \(16 bytes, need 32\)"):
        load_key(path)
