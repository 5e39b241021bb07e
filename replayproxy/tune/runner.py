"""Measure one configuration: fit check, start, warm up, rate search, stop; an outcome either way.

Every replay is the real `replayproxy replay` in a subprocess writing a result file into the
configuration's folder (like the sweep), so each measurement stays on disk for `replayproxy report`.
A configuration that cannot start, or whose engine dies mid-search, becomes a `failed` outcome with
the last lines of its log, and the caller goes on with the next one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayproxy.clock import now_ns
from replayproxy.report.goodput import Slo
from replayproxy.report.runs import load_runs
from replayproxy.report.sweep import Step, client_bound, fails_beyond_noise, meets, step_of
from replayproxy.sweep.steps import run_replay
from replayproxy.tune.candidates import Config
from replayproxy.tune.engine import EngineFailed, Fresh, RunningEngine, log_tail
from replayproxy.tune.fit import TraceFacts, check_fit
from replayproxy.tune.search import search
from replayproxy.tune.store import Outcome, config_dir, identity, load_outcome, save_outcome

ENGINE_LOG = "engine.log"


@dataclass(frozen=True, slots=True)
class Settings:
    """How every configuration is measured (part of each outcome's identity)."""

    traces: tuple[str, ...]
    slos: tuple[Slo, ...]
    slo_spec: str
    repeat: int
    precision: float
    max_runs: int
    start_speed: float
    warmup: int
    max_error_rate: float
    attainment: float
    early_stop: bool

    def identity_fields(self) -> dict[str, Any]:
        return {
            "slo": self.slo_spec,
            "repeat": self.repeat,
            "precision": self.precision,
            "max_runs": self.max_runs,
            "start_speed": self.start_speed,
            "warmup": self.warmup,
            "max_error_rate": self.max_error_rate,
            "attainment": self.attainment,
        }


class Tuner:
    """Measures configurations into `root`, reusing outcomes measured before under the same identity."""

    def __init__(
        self,
        settings: Settings,
        root: Path,
        facts: TraceFacts,
        digest: str,
        say: Callable[[str], None],
        retry_failed: bool = False,
        replay_env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings, self.root, self.facts, self.digest = settings, root, facts, digest
        self.say, self.retry_failed = say, retry_failed
        self.replay_env = replay_env  # carries --api-key to the replays (config.api_key_environment)
        self.reused = 0  # outcomes taken from disk in this run

    def measure(self, config: Config, beat: float | None) -> Outcome:
        """One configuration's outcome; `beat` is the engine's best speed so far (for the early stop)."""
        directory = config_dir(self.root, config)
        ident = identity(config, self.digest, self.settings.identity_fields())
        stored = load_outcome(directory, ident)
        if stored is not None and not (stored.status == "failed" and self.retry_failed):
            self.reused += 1
            self.say(f"{config.label}: {stored.status} before, not measured again")
            return stored
        outcome = Outcome(config.engine.name, config.key, dict(config.knobs), ident, status="measured")
        fit = check_fit(config, self.facts)
        outcome.flags = list(fit.flags)
        for flag in fit.flags:
            self.say(f"{config.label}: note: {flag}")
        if fit.pruned:
            outcome.status, outcome.reason = "pruned", fit.pruned
            self.say(f"{config.label}: pruned before launch: {fit.pruned}")
        else:
            self._launch_and_search(config, directory, outcome, beat if self.settings.early_stop else None)
        save_outcome(directory, outcome)
        return outcome

    def replay(self, engine: RunningEngine, config: Config, speed: float, path: Path, *extra: str) -> Step:
        """One replay of the trace against the engine at `speed`, its figures read back from the result file.

        The run's contract records the full command line and the knob values, so reports show what was tuned.
        """
        s = self.settings
        contract = ["--engine-args", engine.command] if engine.command else []
        run_replay(
            [
                sys.executable, "-m", "replayproxy", "replay", *s.traces, "--target", engine.url,
                "--speed", f"{speed:g}", "-o", str(path), "--quiet", "--label", config.label,
                *contract, "--note", f"tune {config.engine.name}: {config.key}",
                *config.engine.replay_args, *extra,
            ],
            self.replay_env,
        )  # fmt: skip
        run = load_runs([path])[0]
        run.options["speed"] = speed
        return step_of(run, s.slos)

    def passes(self, step: Step) -> bool:
        return meets(step, self.settings.max_error_rate, self.settings.attainment)

    def fails_beyond_noise(self, step: Step) -> bool:
        return fails_beyond_noise(step, self.settings.max_error_rate, self.settings.attainment)

    def _launch_and_search(
        self, config: Config, directory: Path, outcome: Outcome, beat: float | None
    ) -> None:
        s = self.settings
        log = directory / ENGINE_LOG
        launched_ns = now_ns()
        try:
            with Fresh(config, log) as fresh:
                engine = fresh.engine
                outcome.pid, outcome.command = engine.pid, engine.command
                outcome.start_s = (now_ns() - launched_ns) / 1e9
                self.say(f"{config.label}: healthy after {outcome.start_s:.1f} s at {engine.url}")
                if s.warmup and not config.engine.restart_between_runs:  # a restart would undo it
                    warmup = directory / "warmup.rpr"
                    self.replay(engine, config, 1.0, warmup, "--limit", str(s.warmup))
                    warmup.unlink()

                def run_step(speed: float, repetition: int) -> tuple[Step, str]:
                    path = directory / f"speed-{speed:g}-r{repetition}.rpr"
                    step = self.replay(fresh.for_run(), config, speed, path)
                    fresh_start = ", engine restarted before it" if config.engine.restart_between_runs else ""
                    self.say(
                        f"{config.label}: {speed:g}x ({speed * self.facts.rate:.3g} req/s offered) "
                        f"run {repetition}{fresh_start}: {_verdict(self.passes(step), step)}, "
                        f"{step.requests_per_s:.3g} req/s, TTFT p95 {step.ttft_ms.p95:.4g} ms, "
                        f"errors {step.error_rate:.1%}"
                    )
                    return step, str(path)

                found = search(
                    run_step,
                    self.passes,
                    start=s.start_speed,
                    beat=beat,
                    repeat=s.repeat,
                    max_runs=s.max_runs,
                    precision=s.precision,
                    fails_beyond_noise=self.fails_beyond_noise,
                )
        except (EngineFailed, ValueError) as e:
            outcome.status, outcome.reason = "failed", " ".join(str(e).split())
            outcome.log_tail = log_tail(log)
            self.say(f"{config.label}: failed: {outcome.reason}")
            return
        outcome.probes = [p.to_json() for p in found.probes]
        outcome.best_speed, outcome.failed_speed, outcome.stopped = (
            found.best_speed,
            found.failed_speed,
            found.stopped,
        )
        if found.best_speed is not None:
            outcome.best_rate = found.best_speed * self.facts.rate


def _verdict(passed: bool, step: Step) -> str:
    if passed:
        return "pass"
    if client_bound(step):
        return f"fail, client-bound (lag p99 {step.lag_p99_ms:.3g} ms): not counted against the engine"
    return "fail"
