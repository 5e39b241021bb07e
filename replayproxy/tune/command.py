"""`replayproxy tune TRACE --candidates FILE --slo SPEC -o DIR`: each engine tuned, then best vs best.

For every engine of the candidates file, every configuration of its search space (the whole grid,
or one knob at a time from a baseline) is started, warmed up and searched for its highest rate
under the SLO; the best configuration of each engine is then replayed at one common rate and the
report compares them. Engines it starts are its children and are always stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from replayproxy import children
from replayproxy.clock import now_ns
from replayproxy.config import API_KEY_HELP, api_key_environment
from replayproxy.errors import BadOption
from replayproxy.report.goodput import parse_slo
from replayproxy.report.sweep import check_search_options
from replayproxy.sweep.options import add_search_options
from replayproxy.tune.candidates import Config, Engine, load_candidates
from replayproxy.tune.engine import EngineFailed, Fresh
from replayproxy.tune.fit import trace_facts
from replayproxy.tune.render import best_vs_best, table
from replayproxy.tune.runner import Settings, Tuner
from replayproxy.tune.store import Outcome, trace_digest

SUMMARY_FILE = "tune.json"
REPORT_GRACE_S = 5.0
EXAMPLES = (
    "replayproxy tune prod.rpt --candidates candidates.toml --slo 'ttft:p95<=500ms,tpot:p95<=50ms' -o tune",
    "replayproxy tune prod.rpt --candidates candidates.toml --slo 'ttft<=300ms' --repeat 1 -o quick",
    "replayproxy report tune/final/*.rpr --slo 'ttft<=300ms'   # the best-vs-best runs again",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("traces", nargs="+", metavar="TRACE", help="trace file(s) to replay")
    add("--candidates", required=True, metavar="FILE", help="TOML file of engines and knobs (docs/tune.md)")
    add("--slo", required=True, metavar="SPEC", help="the target, e.g. 'ttft:p95<=500ms,tpot:p95<=50ms'")
    add("-o", "--output-dir", default="tune", metavar="DIR", help="results and outcomes (default: tune)")
    add("--repeat", type=int, default=3, metavar="K", help="runs at each final point (default: 3)")
    add("--precision", type=float, default=0.1, help="bisect until the bracket is this narrow (default: 0.1)")
    add_search_options(parser, "each configuration's search")
    add("--warmup", type=int, default=20, metavar="N", help="warm-up requests after each start (default: 20)")
    add(
        "--no-early-stop",
        dest="early_stop",
        action="store_false",
        help="search every configuration fully, even one that cannot beat the best so far",
    )
    add("--retry-failed", action="store_true", help="measure configurations that failed before again")
    add("--no-final", dest="final", action="store_false", help="skip the best-vs-best replays at one rate")
    add("--api-key", metavar="KEY", help=API_KEY_HELP + " (to the replays)")


def run(args: argparse.Namespace) -> int:
    with children.signals_interrupt():  # SIGTERM/SIGHUP stop every engine and replay as Ctrl-C does
        return _tune(args)


def _tune(args: argparse.Namespace) -> int:
    settings = _settings(args)
    engines = load_candidates(args.candidates)
    facts = trace_facts(settings.traces)
    root = Path(args.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    started_ns = now_ns()
    total = sum(_planned(e) for e in engines)
    done = 0

    def say(text: str) -> None:
        print(f"tune: {text}", file=sys.stderr, flush=True)

    digest = trace_digest(settings.traces)
    tuner = Tuner(settings, root, facts, digest, say, args.retry_failed, api_key_environment(args.api_key))
    outcomes: list[Outcome] = []

    def measured(config: Config, beat: float | None) -> Outcome:
        nonlocal done
        outcome = tuner.measure(config, beat)
        outcomes.append(outcome)
        done += 1
        say(_progress(done, total, tuner.reused, started_ns))
        return outcome

    say(
        f"{total} configuration(s) of {len(engines)} engine(s); trace {facts.requests} requests at "
        f"{facts.rate:.3g} req/s over {facts.span_s:.1f} s"
    )
    for engine in engines:
        _tune_engine(engine, measured)
    best = _best_per_engine(outcomes)
    final = _final_runs(best, engines, tuner, root, settings.repeat) if args.final and len(best) > 1 else []
    sys.stdout.write(table(outcomes, facts))
    sys.stdout.write(best_vs_best(best, settings.repeat, settings.precision, outcomes))
    summary = {
        "trace": {"requests": facts.requests, "rate": facts.rate, "span_s": facts.span_s},
        "slo": settings.slo_spec,
        "outcomes": [asdict(o) for o in outcomes],
        "best": {name: o.config for name, o in best.items()},
        "final": final,
    }
    (root / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    if final:
        report = [sys.executable, "-m", "replayproxy", "report", *final, "--slo", settings.slo_spec]
        sys.stdout.flush()
        with children.owned(report, REPORT_GRACE_S) as shown:
            shown.wait()
    return 0 if best else 1


def _settings(args: argparse.Namespace) -> Settings:
    if args.repeat < 1:
        raise BadOption(f"--repeat must be at least 1, got {args.repeat}")
    if not 0 < args.precision < 1:
        raise BadOption(f"--precision must be in (0, 1), got {args.precision:g}")
    if args.warmup < 0:
        raise BadOption(f"--warmup must not be negative, got {args.warmup}")
    check_search_options(args.max_runs, args.start_speed, args.max_error_rate, args.attainment)
    return Settings(
        traces=tuple(args.traces),
        slos=parse_slo(args.slo),
        slo_spec=args.slo,
        repeat=args.repeat,
        precision=args.precision,
        max_runs=args.max_runs,
        start_speed=args.start_speed,
        warmup=args.warmup,
        max_error_rate=args.max_error_rate,
        attainment=args.attainment,
        early_stop=args.early_stop,
    )


def _planned(engine: Engine) -> int:
    """How many configurations the engine's strategy will measure (for the ETA)."""
    if engine.strategy == "one-at-a-time":
        return 1 + sum(len(values) - 1 for values in engine.grid.values())
    return math.prod(len(values) for values in engine.grid.values())


def _tune_engine(engine: Engine, measured: Callable[[Config, float | None], Outcome]) -> None:
    if engine.strategy == "grid":
        best: float | None = None
        for config in engine.configurations():
            best = _better(best, measured(config, best).best_speed)
        return
    current = engine.baseline_config()
    current_best = measured(current, None).best_speed
    for knob, values in engine.grid.items():
        keep = current
        for value in values:
            if value == current.knobs[knob]:
                continue
            candidate = current.with_knob(knob, value)
            speed = measured(candidate, current_best).best_speed
            if speed is not None and (current_best is None or speed > current_best):
                keep, current_best = candidate, speed
        current = keep


def _better(a: float | None, b: float | None) -> float | None:
    return max((s for s in (a, b) if s is not None), default=None)


def _best_per_engine(outcomes: list[Outcome]) -> dict[str, Outcome]:
    """Each engine's configuration with the highest speed under the SLO (goodput breaks ties)."""
    best: dict[str, Outcome] = {}
    for o in outcomes:
        if o.best_speed is None:
            continue
        held = best.get(o.engine)
        if held is None or (o.best_speed, o.at_best("goodput_per_s") or 0.0) > (
            held.best_speed or 0.0,
            held.at_best("goodput_per_s") or 0.0,
        ):
            best[o.engine] = o
    return best


def _final_runs(
    best: dict[str, Outcome], engines: list[Engine], tuner: Tuner, root: Path, repeat: int
) -> list[str]:
    """Each engine's best configuration replayed at one rate (the lowest of the bests), `repeat` times."""
    speed = min(o.best_speed or math.inf for o in best.values())
    by_name = {e.name: e for e in engines}
    paths: list[str] = []
    for name, outcome in best.items():
        config = Config(by_name[name], outcome.knobs)
        if outcome.best_speed == speed:
            paths += [p["path"] for p in outcome.probes if p["speed"] == speed]
            continue
        tuner.say(f"{config.label}: replaying at the common {speed:g}x for the comparison")
        directory = root / "final" / name
        directory.mkdir(parents=True, exist_ok=True)
        try:
            with Fresh(config, directory / "engine.log") as fresh:
                for repetition in range(1, repeat + 1):
                    path = directory / f"speed-{speed:g}-r{repetition}.rpr"
                    tuner.replay(fresh.for_run(), config, speed, path)
                    paths.append(str(path))
        except (EngineFailed, ValueError) as e:
            tuner.say(f"{config.label}: the comparison run failed: {' '.join(str(e).split())}")
            return []
    return paths


def _progress(done: int, total: int, reused: int, started_ns: int) -> str:
    elapsed = (now_ns() - started_ns) / 1e9
    measured = max(done - reused, 1)
    left = max(total - done, 0)
    eta = f", ETA {_duration(elapsed / measured * left)}" if left and done > reused else ""
    return f"[{done}/{total} configurations] elapsed {_duration(elapsed)}{eta}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
