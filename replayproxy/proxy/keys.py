"""The prefix-hash key: shared by a fleet through a file, or random per recorder.

Only `shape.key_fingerprint(key)` ever leaves this process (in trace headers).
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from replayproxy.config import ConfigError

MIN_KEY_BYTES = 16


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
    if len(raw) < MIN_KEY_BYTES:
        raise ConfigError(f"hash_key_file {path}: key too short ({len(raw)} bytes, need {MIN_KEY_BYTES}+)")
    return raw if len(raw) <= 64 else hashlib.blake2b(raw).digest()  # blake2b keys are at most 64 bytes


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
