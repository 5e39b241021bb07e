"""The hash key file: created private, shared when present, refused when weak."""

from __future__ import annotations

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
    long.write_bytes(b"x" * 100)
    assert len(load_key(long)) == 64
