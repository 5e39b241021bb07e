"""What `capacity` (and `tune`) read from the user: a model's architecture, from a local config.json,
a llama.cpp model file (.gguf) or a preset (never downloaded), and a memory size.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from replayproxy import gguf_model
from replayproxy.capacity.memory import ModelConfigError, ModelSpec
from replayproxy.capacity.presets import PRESETS, find_preset
from replayproxy.errors import BadOption, MissingFile, user_file

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_memory_size(text: str) -> int:
    """Bytes from '80GiB', '81559MiB', '24GB', '80G' (G, M, T alone are binary, like nvidia-smi's MiB)."""
    match = _SIZE.match(text)
    if not match:
        raise BadOption(f"bad memory size {text!r}; use e.g. 80GiB, 81559MiB or 24GB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    if not unit:
        raise BadOption(f"memory size {text!r} needs a unit (GiB, MiB, GB, ...)")
    binary = "i" in unit or len(unit) == 1 and unit != "b"
    scale = 1024 ** "bkmgt".index(unit[0]) if binary else _UNITS[unit[0]]
    size = int(number * scale)
    if size <= 0:
        raise BadOption(f"memory size {text!r} must be positive")
    return size


def load_model(text: str) -> tuple[ModelSpec, str]:
    """A local config.json (file or folder), a GGUF file or a preset; never downloads."""
    path = Path(text).expanduser()
    if path.suffix == ".gguf":
        return from_gguf(path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            with user_file(path):
                config = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelConfigError(f"{path}: not a JSON config ({e})") from e
        if not isinstance(config, dict):
            raise ModelConfigError(f"{path}: not a JSON object")
        name = path.parent.name if path.name == "config.json" else path.stem
        try:
            return ModelSpec.from_hf_config(config, name=name), str(path)
        except ModelConfigError as e:
            raise ModelConfigError(f"{path}: {e}") from e
    preset = find_preset(text)
    if preset is not None:
        name, repo, config = preset
        return ModelSpec.from_hf_config(config, name=name), f"preset, from {repo} config.json"
    if path.suffix == ".json" or path.parent != Path("."):
        raise MissingFile(f"no such model config: {text}")
    raise BadOption(
        f"unknown model preset {text!r}; valid: {', '.join(PRESETS)} (or a path to a config.json)"
    )


def from_gguf(path: Path) -> tuple[ModelSpec, str]:
    """A llama.cpp model file: its dimensions from the GGUF metadata; the weights counted in the
    nearest format capacity knows (said in the source line)."""
    if not path.is_file():
        raise MissingFile(f"no such model file: {path}")
    found = gguf_model.dimensions(path)
    counted = "" if found.file_type in gguf_model.WEIGHT_FORMATS else ", weights counted as 16-bit"
    try:
        spec = ModelSpec.from_hf_config(found.config, name=found.name)
    except ModelConfigError as e:
        raise ModelConfigError(f"{path}: {e}") from e
    return spec, f"{path}, GGUF {found.file_type}{counted}"
