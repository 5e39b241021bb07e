"""The candidates file: which engines to tune, how to start each, and the knobs to search.

A TOML file with one `[[engine]]` table per candidate (docs/tune.md). An engine is either a running
`url`, measured as it is, or a `command` template whose `{port}`, `{host}` and `{knob}` placeholders
are filled for each configuration of its search space (`grid`, and `baseline` for the
one-knob-at-a-time strategy). The template is split into arguments once, as a shell would split it
(no shell runs), and each placeholder is then filled inside its argument: a value is always exactly
the part of one argument it replaces, whatever spaces, quotes or `;` it holds. Every mistake is
reported with the engine's name and the key.
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayproxy.config import ConfigError

Knob = int | float | str | bool
STRATEGIES = ("grid", "one-at-a-time")
LOCAL_HOST = "127.0.0.1"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# An engine's name is a folder under the output directory: never empty, `.`, `..`, hidden or a path.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ENGINE_KEYS = {
    "name", "url", "command", "health", "env", "start_timeout", "stop_timeout", "grid", "baseline",
    "strategy", "replay_args", "capacity", "restart_between_runs",
}  # fmt: skip
_CAPACITY_KEYS = {"model", "gpu_memory", "gpus", "tp", "kv_dtype", "weight_dtype"}


@dataclass(frozen=True, slots=True)
class Engine:
    """One candidate: how to reach or start it, and what to search."""

    name: str
    url: str = ""
    command: str = ""  # the template as written (part of each outcome's identity)
    arguments: tuple[str, ...] = ()  # the template split into arguments, placeholders still in them
    health: str = "/health"
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    grid: Mapping[str, tuple[Knob, ...]] = field(default_factory=dict)
    baseline: Mapping[str, Knob] = field(default_factory=dict)
    strategy: str = "grid"
    replay_args: tuple[str, ...] = ()
    capacity: Mapping[str, Any] = field(default_factory=dict)  # model + GPU facts for the fit check
    # Each measured replay on a freshly started engine: a cold cache where the engine has no reset.
    restart_between_runs: bool = False

    @property
    def launched(self) -> bool:
        return bool(self.command)

    def configurations(self) -> Iterator[Config]:
        """Every point of the grid, in file order (the last knob varies fastest)."""
        names = list(self.grid)
        for values in itertools.product(*(self.grid[n] for n in names)):
            yield Config(self, dict(zip(names, values, strict=True)))

    def baseline_config(self) -> Config:
        return Config(self, {name: self.baseline[name] for name in self.grid})


@dataclass(frozen=True, slots=True)
class Config:
    """One configuration of an engine: its knob values."""

    engine: Engine
    knobs: Mapping[str, Knob]

    @property
    def key(self) -> str:
        """Stable text naming the knob values, e.g. `max_num_seqs=64,max_num_batched_tokens=2048`."""
        return ",".join(f"{name}={_text(value)}" for name, value in self.knobs.items()) or "as-is"

    @property
    def label(self) -> str:
        return f"{self.engine.name}[{self.key}]" if self.knobs else self.engine.name

    @property
    def directory_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=,-]", "_", self.key).replace(",", "_").replace("=", "-")

    def argv(self, port: int) -> list[str]:
        """The command's arguments for this configuration, each placeholder filled in its argument."""
        values = self._values(port)
        return [fill(argument, values) for argument in self.engine.arguments]

    def environment(self, port: int) -> dict[str, str]:
        values = self._values(port)
        return {name: fill(value, values) for name, value in self.engine.env.items()}

    def _values(self, port: int) -> dict[str, str]:
        return {"port": str(port), "host": LOCAL_HOST, **{k: _text(v) for k, v in self.knobs.items()}}

    def with_knob(self, name: str, value: Knob) -> Config:
        return Config(self.engine, {**self.knobs, name: value})


def fill(template: str, values: Mapping[str, str]) -> str:
    """Replace `{name}` placeholders; other braces (JSON in an argument) are left alone."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def load_candidates(path: str | Path) -> list[Engine]:
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read candidates file {path}: {e.strerror}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"candidates file {path} is not valid TOML: {e}") from e
    return parse_candidates(raw, str(path))


def parse_candidates(raw: Mapping[str, Any], source: str) -> list[Engine]:
    unknown = set(raw) - {"engine", "strategy"}
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(sorted(unknown))}; engines go in [[engine]]")
    default_strategy = raw.get("strategy", "grid")
    tables = raw.get("engine")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{source}: no [[engine]] table; see docs/tune.md")
    engines = [_engine(t, i, source, default_strategy) for i, t in enumerate(tables, 1)]
    names = [e.name for e in engines]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{source}: engine name(s) used twice: {', '.join(duplicates)}")
    return engines


def _engine(table: Any, number: int, source: str, default_strategy: Any) -> Engine:
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: [[engine]] #{number} is not a table")
    name = table.get("name")
    where = f"{source}: engine {name!r}" if isinstance(name, str) and name else f"{source}: engine #{number}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: 'name' must start with a letter or digit, then letters, digits, '.', '_' or '-' "
            "(at most 64; it names a folder under the output directory)"
        )
    unknown = set(table) - _ENGINE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    url, command = _string(table, "url", where), _string(table, "command", where)
    if bool(url) == bool(command):
        raise ConfigError(f"{where}: give exactly one of 'url' (a running engine) or 'command'")
    grid = _grid(table.get("grid", {}), where)
    if url and grid:
        raise ConfigError(f"{where}: a 'grid' needs a 'command' to start each configuration")
    strategy = table.get("strategy", default_strategy)
    if strategy not in STRATEGIES:
        raise ConfigError(f"{where}: strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    baseline = _baseline(table.get("baseline", {}), grid, strategy, where)
    health = _string(table, "health", where) or "/health"
    if not health.startswith("/"):
        raise ConfigError(f"{where}: 'health' must be a path starting with '/', got {health!r}")
    arguments = _arguments(command, grid, where) if command else ()
    restart = table.get("restart_between_runs", False)
    if not isinstance(restart, bool):
        raise ConfigError(f"{where}: 'restart_between_runs' must be true or false, got {restart!r}")
    if restart and url:
        raise ConfigError(f"{where}: 'restart_between_runs' needs a 'command' to start the engine again")
    return Engine(
        name=name,
        url=url.rstrip("/"),
        command=command,
        arguments=arguments,
        health=health,
        env=_env(table.get("env", {}), where),
        start_timeout_s=_seconds(table, "start_timeout", 600.0, where),
        stop_timeout_s=_seconds(table, "stop_timeout", 30.0, where),
        grid=grid,
        baseline=baseline,
        strategy=str(strategy),
        replay_args=_strings(table.get("replay_args", []), "replay_args", where),
        capacity=_capacity(table.get("capacity", {}), where),
        restart_between_runs=restart,
    )


def _string(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise ConfigError(f"{where}: '{key}' must be a string")
    return value.strip()


def _strings(value: Any, key: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: '{key}' must be a list of strings")
    return tuple(value)


def _seconds(table: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"{where}: '{key}' must be a positive number of seconds, got {value!r}")
    if value > 86400:
        raise ConfigError(f"{where}: '{key}' of {value} s is over a day")
    return float(value)


def _grid(value: Any, where: str) -> dict[str, tuple[Knob, ...]]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: 'grid' must be a table of knob = [values]")
    grid: dict[str, tuple[Knob, ...]] = {}
    for knob, values in value.items():
        if knob in ("port", "host") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", knob):
            raise ConfigError(f"{where}: grid knob {knob!r} must be an identifier other than port/host")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}: grid.{knob} must be a non-empty list of values")
        for v in values:
            _check_knob(v, f"{where}: grid.{knob}")
        if len(set(map(_text, values))) != len(values):
            raise ConfigError(f"{where}: grid.{knob} lists a value twice")
        grid[knob] = tuple(values)
    return grid


def _baseline(value: Any, grid: Mapping[str, tuple[Knob, ...]], strategy: Any, where: str) -> dict[str, Knob]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: 'baseline' must be a table of knob = value")
    unknown = set(value) - set(grid)
    if unknown:
        raise ConfigError(f"{where}: baseline knob(s) {', '.join(sorted(unknown))} are not in the grid")
    for knob, v in value.items():
        _check_knob(v, f"{where}: baseline.{knob}")
    if strategy == "one-at-a-time":
        missing = [k for k in grid if k not in value]
        if missing:
            raise ConfigError(
                f"{where}: one-at-a-time starts from a baseline; give baseline.{missing[0]} "
                f"(every grid knob needs one)"
            )
    return dict(value)


def _check_knob(value: Any, where: str) -> None:
    if not isinstance(value, int | float | str | bool):
        raise ConfigError(f"{where}: values must be numbers, strings or booleans, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r} is not a finite number")


def _env(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where}: 'env' must be a table of NAME = \"value\" strings")
    return dict(value)


def _capacity(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: 'capacity' must be a table (model, gpu_memory, tp, ...)")
    unknown = set(value) - _CAPACITY_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown capacity key(s) {', '.join(sorted(unknown))}")
    if value and not {"model", "gpu_memory"} <= set(value):
        raise ConfigError(f"{where}: capacity needs both 'model' and 'gpu_memory'")
    return dict(value)


def _arguments(command: str, grid: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The template split once into arguments; every placeholder it uses must be known."""
    try:
        arguments = tuple(shlex.split(command))
    except ValueError as e:
        raise ConfigError(f"{where}: 'command' cannot be split into arguments ({e})") from e
    used = {name for argument in arguments for name in _PLACEHOLDER.findall(argument)}
    unknown = used - set(grid) - {"port", "host"}
    if unknown:
        raise ConfigError(f"{where}: command uses {{{sorted(unknown)[0]}}}, which is not a grid knob")
    if "port" not in used:
        raise ConfigError(f"{where}: the command must listen on {{port}} (a free local port per start)")
    unused = set(grid) - used
    if unused:
        raise ConfigError(f"{where}: grid knob {sorted(unused)[0]!r} does not appear in the command")
    return arguments


def _text(value: Knob) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)
