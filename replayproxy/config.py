"""Settings from TOML, environment and command line, merged into frozen dataclasses.

Precedence: command line > environment (`REPLAYPROXY_<SECTION>_<KEY>`) > TOML file > defaults.
Each feature package declares its own dataclass; this module only knows how to fill one, so a
typo in a file or variable is reported with the valid names instead of being silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit

from replayproxy.errors import BadOption

T = TypeVar("T")


class ConfigError(BadOption):
    """A setting that cannot be used; the message names the setting and where it came from."""


def check_finite(settings: Any) -> None:
    """Refuse inf and NaN in any float field of a settings dataclass, naming the field: they pass
    `> 0` checks and then break timer arithmetic."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{f.name} must be a finite number, got {value}")


def read_toml(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
    except UnicodeDecodeError as e:  # TOML is UTF-8 (toml.io, spec 1.0)
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
        ) from e


# The bearer token for a target, read alike by every command that sends to one (replay, compare,
# sweep, tune, check): the flag, then one variable of ours, then the one the OpenAI SDK reads.
API_KEY_VARIABLE = "REPLAYPROXY_API_KEY"
API_KEY_ALIASES = ("REPLAYPROXY_CHECK_API_KEY",)  # check's own name, before the shared one
API_KEY_FALLBACK = "OPENAI_API_KEY"
API_KEY_SOURCES = f"--api-key, ${API_KEY_VARIABLE} or ${API_KEY_FALLBACK}"
API_KEY_HELP = (
    f"bearer token for the target, never stored (default: ${API_KEY_VARIABLE}, else ${API_KEY_FALLBACK})"
)


def api_key(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    """`given` (the flag, or a command's own setting), else the first of the variables that is set."""
    if given:
        return given
    env = os.environ if environ is None else environ
    for name in (API_KEY_VARIABLE, *API_KEY_ALIASES, API_KEY_FALLBACK):
        if env.get(name):
            return env[name]
    return ""


def api_key_environment(given: str | None) -> dict[str, str] | None:
    """The environment for a child command that should use the key `given` on our command line: it
    travels in the variable, never in an argument vector that `ps` shows. None: inherit ours."""
    return {**os.environ, API_KEY_VARIABLE: given} if given else None


def labelled(values: list[str], what: str) -> dict[str, str]:
    """`LABEL=VALUE` options (e.g. `--target A=URL`) in order, each label once."""
    pairs: dict[str, str] = {}
    for value in values:
        label, sep, rest = value.partition("=")
        if not sep or not label or not rest:
            raise BadOption(f"{what} {value!r}: expected LABEL=VALUE")
        if label in pairs:
            raise BadOption(f"{what}: label {label!r} given twice")
        pairs[label] = rest
    return pairs


def http_url(url: str, what: str) -> SplitResult:
    """`url` split, refused in one line unless it is http(s) with a host and a port in 0..65535
    (urlsplit defers the port's check to the first `.port`, which raises a bare ValueError)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadOption(f"{what} must be an http:// or https:// URL, got {url!r}")
    try:
        parts.port  # noqa: B018 — the check is the access
    except ValueError as e:
        raise BadOption(f"{what} {url!r}: the port must be a number in 0..65535") from e
    return parts


def build(
    cls: type[T],
    *,
    section: str,
    file_values: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Fill dataclass `cls` from a TOML section, `REPLAYPROXY_<SECTION>_*` variables and overrides.

    `overrides` holds command-line values; None means "not given on the command line".
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in (file_values or {}).items():
        key = key.replace("-", "_")
        if key not in names:
            raise ConfigError(f"unknown setting [{section}] {key}; valid: {', '.join(sorted(names))}")
        values[key] = _coerce(value, hints[key], f"[{section}] {key}")
    prefix = f"REPLAYPROXY_{section.upper()}_"
    env = os.environ if environ is None else environ
    for var, raw in env.items():
        if not var.startswith(prefix):
            continue
        key = var[len(prefix) :].lower()
        if key not in names:
            raise ConfigError(
                f"unknown setting {var}; valid: {', '.join(prefix + n.upper() for n in sorted(names))}"
            )
        values[key] = _coerce(raw, hints[key], var)
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _coerce(value, hints[key], f"--{key.replace('_', '-')}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"[{section}]: {e}") from e


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Turn TOML or environment text into the field's type, or say which setting is wrong."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
            return None
        hint = options[0]
        origin = typing.get_origin(hint)
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        if hint in (int, float):
            if isinstance(value, bool):
                raise ValueError(f"not a number: {value!r}")
            return hint(value)
        if hint is str:
            return str(value)
        if hint is Path:
            return Path(value)
        if origin is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(str(i).strip() for i in items if str(i).strip())
        if origin is dict:
            if not isinstance(value, Mapping):
                raise ValueError(f"not a table: {value!r}")
            return dict(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from e
    return value
