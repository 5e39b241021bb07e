"""What tune keeps on disk, so a rerun with the same `-o DIR` skips what it already measured.

Each configuration has its own folder `DIR/<engine>/<knobs>/` holding the engine's log, every
replay's result file and `outcome.json`: the status (measured, failed, pruned), the full command
line and knob values, the search's probes and its answer. The outcome carries an identity digest
of everything that decides the measurement (command template, knobs, environment, replay options,
trace bytes, SLO and search settings); a rerun reuses an outcome only when the digest agrees.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from replayproxy.trace import expand_paths, storage
from replayproxy.tune.candidates import Config

OUTCOME_FILE = "outcome.json"


@dataclass(slots=True)
class Outcome:
    """One configuration's record: how it went, and what it reached."""

    engine: str
    config: str  # the knob values as text (Config.key)
    knobs: dict[str, Any]
    identity: str
    status: str  # "measured" | "failed" | "pruned"
    reason: str = ""  # why it failed or was pruned
    flags: list[str] = field(default_factory=list)  # fit doubts that did not stop the launch
    command: str = ""  # the full command line of the (last) start
    pid: int | None = None
    start_s: float | None = None  # seconds from launch to healthy
    log_tail: str = ""
    best_speed: float | None = None
    failed_speed: float | None = None
    best_rate: float | None = None  # req/s offered at best_speed (the trace's rate x speed)
    stopped: str = ""
    probes: list[dict[str, Any]] = field(default_factory=list)

    def at_best(self, name: str) -> float | None:
        """Mean of one probe figure over the repeats at the best speed (None when not measured)."""
        values = [p[name] for p in self.probes if p["speed"] == self.best_speed and p[name] is not None]
        return sum(values) / len(values) if values else None


def config_dir(root: Path, config: Config) -> Path:
    return root / config.engine.name / config.directory_name


def identity(config: Config, trace_digest: str, settings: Mapping[str, Any]) -> str:
    engine = config.engine
    material: dict[str, object] = {
        "command": engine.command,
        "url": engine.url,
        "knobs": dict(config.knobs),
        "env": dict(engine.env),
        "replay_args": list(engine.replay_args),
        "trace": trace_digest,
        "settings": dict(settings),
    }
    if engine.restart_between_runs:  # measured otherwise; kept out when off so older outcomes still match
        material["restart_between_runs"] = True
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:32]


def trace_digest(paths: Iterable[str | os.PathLike[str]]) -> str:
    digest = hashlib.sha256()
    for path in expand_paths(paths):
        with storage.opened(path) as data:
            digest.update(data)
    return digest.hexdigest()[:32]


def load_outcome(directory: Path, expected_identity: str) -> Outcome | None:
    """The stored outcome if it was measured under the same identity; None means measure again."""
    try:
        raw = json.loads((directory / OUTCOME_FILE).read_text(encoding="utf-8"))
        outcome = Outcome(**raw)
    except (OSError, ValueError, TypeError):
        return None
    return outcome if outcome.identity == expected_identity else None


def save_outcome(directory: Path, outcome: Outcome) -> None:
    """Write atomically: a crash mid-write leaves the old outcome or none, never half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / (OUTCOME_FILE + ".partial")
    partial.write_text(json.dumps(asdict(outcome), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, directory / OUTCOME_FILE)
