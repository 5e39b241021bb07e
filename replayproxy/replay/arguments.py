"""The replay command's options: their declarations and the `ReplayOptions` they make, shared by
`replay` and by `compare`, which reads each candidate's `--replay-args` with this same parser."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from replayproxy import config
from replayproxy.replay import procedure, progress, replies
from replayproxy.replay.flavors import FLAVORS
from replayproxy.replay.options import PREPARE_MODES, ReplayOptions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("traces", nargs="+", metavar="TRACE", help="trace files (.rpt), directories or globs")
    add(
        "--target",
        "--base-url",
        dest="target",
        help="base URL of the engine, e.g. http://127.0.0.1:8000/v1 (default: none, required)",
    )
    add("-o", "--output", metavar="RESULT.rpr", help="result file to write (default: none, required)")
    add("--speed", type=float, help="time scale: 2 sends twice as fast (default: 1)")
    add(
        "--request-rate",
        type=float,
        metavar="R",
        help="scale the trace's timing to R req/s on average, instead of --speed (default: off)",
    )
    add(
        "--max-concurrency",
        type=int,
        metavar="N",
        help="cap requests in flight; timing is then not preserved (default: 0, no cap)",
    )
    add("--flavor", choices=["auto", *FLAVORS], help="engine dialect (default: auto, from /v1/models)")
    add("--model", help="send every request to this model (default: the recorded one, if served)")
    add(
        "--limit",
        "--num-prompts",
        dest="limit",
        type=int,
        metavar="N",
        help="replay at most N requests; whole sessions in closed loop (default: all)",
    )
    add(
        "--sessions",
        choices=["auto", "closed", "open"],
        help="closed: a session's next turn goes at the previous turn's end plus its think time; "
        "open: every request at its recorded offset (default: auto, closed if any session has 2+ turns)",
    )
    add(
        "--replies",
        choices=list(replies.MODES),
        help="live: in closed loop a later turn carries the candidate's reply to the turn before it, "
        "its new part sized to the recorded input length (needs exact prompts); planned: synthetic "
        "words where the reply stood (default: live)",
    )
    add(
        "--sample-sessions",
        type=float,
        metavar="F",
        help="replay this fraction of whole sessions, chosen by --seed (default: all)",
    )
    add("--start-offset", type=float, metavar="S", help="skip the first S seconds of the trace (default: 0)")
    add("--duration", type=float, metavar="S", help="replay only S seconds of the trace (default: all)")
    add("--seed", type=int, help="prompt synthesis seed; same seed, same bodies (default: 0)")
    add("--timeout", type=float, metavar="S", help="per-request timeout in seconds (default: 600)")
    add("--label", help="name of this run in reports (default: flavor@host)")
    add(
        "--api-key",
        metavar="KEY",
        help=config.API_KEY_HELP,
    )
    add(
        "--max-error-rate",
        type=float,
        metavar="SHARE",
        help="exit 1 when more than this share of requests failed (default: 0.5)",
    )
    add("--quiet", action="store_const", const=True, help="no progress display (--progress none)")
    add(
        "--progress",
        choices=progress.MODES,
        help="live panel (tty), a line every 10 s (log) or none (default: auto, tty on a terminal, else log)",
    )
    add("--workers", type=int, metavar="N", help="sender processes sharing one start time (default: 1)")
    add(
        "--shard",
        metavar="i/N",
        help="send shard i of N: whole sessions, with the requests linked to them, by a keyed hash; "
        "N processes or pods with one --start-at send the trace between them (default: all)",
    )
    add("--start-at", metavar="TIME", help="common start: UTC ISO time or unix seconds (default: now)")
    add(
        "--no-reset-prefix-cache",
        dest="reset_prefix_cache",
        action="store_const",
        const=False,
        help="skip the flavor's cache reset before the run",
    )
    add(
        "--no-calibrate",
        dest="calibrate",
        action="store_const",
        const=False,
        help="skip chat token calibration (lengths then assume the default template)",
    )
    add(
        "--tokenizer",
        metavar="PATH",
        help="local Hugging Face tokenizer.json (or its model directory), or a llama.cpp .gguf, for exact "
        "prompt lengths (default: the served one found on this host, else the engine's tokenize endpoint)",
    )
    add("--chat-template", metavar="FILE", help="Jinja chat template for --tokenizer (default: its own)")
    add(
        "--allow-approximate",
        action="store_const",
        const=True,
        help="go on with calibrated (approximate) prompt lengths when exact ones cannot be built; "
        "the result and the report then say the candidate is not like for like",
    )
    add(
        "--include-failed",
        action="store_const",
        const=True,
        help="also replay requests that failed when recorded (left out by default)",
    )
    add(
        "--pool-size",
        type=int,
        metavar="N",
        help="connections opened before the run (default: peak concurrency)",
    )
    add(
        "--scrape-metrics",
        nargs="?",
        const="/metrics",
        metavar="URL",
        help="poll the engine's Prometheus metrics during the run; URL: the target's /metrics (default: off)",
    )
    add(
        "--scrape-interval",
        type=float,
        metavar="S",
        help="metrics polling interval in seconds (default: 0.25)",
    )
    add(
        "--gpu-sampler",
        metavar="CMD",
        help="command printing GPU samples as CSV lines, e.g. nvidia-smi ... -lms 250 (default: none)",
    )
    add(
        "--warmup",
        metavar="N|Ss",
        help="first send the trace's first N requests (or S seconds) at their timing, not measured "
        "(default: none)",
    )
    add(
        "--repeat",
        type=int,
        metavar="K",
        help="measure K times, each after the cache reset, into RESULT-runI.rpr under one label (default: 1)",
    )
    add(
        "--engine-args",
        metavar="TEXT",
        help="how the engine was started, kept with the run's contract (default: none)",
    )
    add("--note", metavar="TEXT", help="free text kept with the run (default: none)")
    add(
        "--prepare",
        choices=PREPARE_MODES,
        help="stream: bodies are prepared by a helper process while the run goes, a window ahead of "
        "the clock; upfront: every body before the start (default: stream)",
    )
    add(
        "--prepare-window",
        type=float,
        metavar="S",
        help="seconds of the schedule whose bodies are held ready ahead of the clock (default: 20)",
    )
    add(
        "--prepare-memory",
        type=int,
        metavar="MIB",
        help="memory the ready bodies may take, per sender process (default: 512)",
    )
    add(
        "--via-proxy",
        metavar="DIR",
        help="send through a replayproxy proxy started in front of the target, which records each run's "
        "own trace in DIR/<result name>: the report then times the replay at a proxy, as production "
        "was (default: straight to the target)",
    )
    add("--config", metavar="FILE", help="TOML file; settings under [replay] (default: none)")


# Every setting but the secret can come from the command line; argparse leaves the absent ones None.
_OPTION_NAMES = tuple(
    f.name for f in dataclasses.fields(ReplayOptions) if f.name not in ("traces", "api_key")
)


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    file_values = config.read_toml(args.config).get("replay", {})
    overrides: dict[str, Any] = {name: getattr(args, name, None) for name in _OPTION_NAMES}
    overrides["traces"] = tuple(args.traces)
    overrides["api_key"] = getattr(args, "api_key", None)
    if overrides.get("request_rate") is not None and overrides.get("speed") is not None:
        raise config.ConfigError("--request-rate and --speed both set the timing; give one")
    options = config.build(ReplayOptions, section="replay", file_values=file_values, overrides=overrides)
    if not options.target:
        raise config.ConfigError("--target is required (or [replay] target in the config file)")
    if not options.output:
        raise config.ConfigError("-o/--output is required (or [replay] output in the config file)")
    if options.warmup:
        procedure.Warmup.parse(options.warmup)
    if options.repeat > 1 and options.start_at:
        raise config.ConfigError("--repeat cannot share one --start-at: each run starts after the last")
    return dataclasses.replace(options, api_key=config.api_key(options.api_key))
