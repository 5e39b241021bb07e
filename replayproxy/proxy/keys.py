"""The prefix-hash key: shared by a fleet through a file, or random per recorder.

Only `shape.key_fingerprint(key)` ever leaves this process (in trace headers).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from replayproxy.config import ConfigError

MIN_KEY_BYTES = 32  # e.g. `secrets.token_hex(16)`; the created key is token_hex(32)
MIN_DISTINCT_BYTES = 8  # "0000...", "aaaa..." are not keys
# Words of a value copied from an example instead of generated: such a key is known to everyone.
PLACEHOLDER_WORDS = ("replace", "change", "example", "placeholder", "secret", "your", "todo", "xxxx")


def load_key(path: Path | None) -> bytes:
    """The key from `path` (created with 32 random bytes in hex, mode 0600, if missing), else random."""
    if path is None:
        return secrets.token_bytes(32)
    try:
        raw = path.read_bytes().strip()
    except FileNotFoundError:
        return _create(path)
    except OSError as e:
        raise ConfigError(f"hash_key_file {path}: cannot read ({e.strerror})") from e
    check_key(raw, path)
    return raw if len(raw) <= 64 else hashlib.blake2b(raw).digest()  # blake2b keys are at most 64 bytes


def check_key(raw: bytes, path: Path) -> None:
    """Refuse a key that is too short, or a placeholder left from an example (the message never shows it)."""
    how = "generate one with: python -c 'import secrets; print(secrets.token_hex(32))'"
    if len(raw) < MIN_KEY_BYTES:
        short = f"key too short ({len(raw)} bytes, need {MIN_KEY_BYTES})"
        raise ConfigError(f"hash_key_file {path}: {short}; {how}")
    lowered = raw.lower()
    if len(set(raw)) < MIN_DISTINCT_BYTES or any(word.encode() in lowered for word in PLACEHOLDER_WORDS):
        raise ConfigError(f"hash_key_file {path}: the key is a placeholder, not a random key; {how}")


def _create(path: Path) -> bytes:
    key = secrets.token_hex(32).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another sidecar created it first: use theirs
        return load_key(path)
    except OSError as e:
        raise ConfigError(f"hash_key_file {path}: cannot create ({e.strerror})") from e
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
    return key
