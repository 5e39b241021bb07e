"""`replayproxy check --target LABEL=URL ... --prompts FILE.jsonl -o CHECK.rpc`: send, score, summarise.

Glue: it asks each target what it is (replay's describe and flavor guess), runs the check, and
prints the report's verdict and per-target table for the file it wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import aiohttp

from replayproxy import children, config
from replayproxy.check.builtin import builtin_prompts
from replayproxy.check.prompts import PromptSet, read_prompts
from replayproxy.check.requests import DEFAULT_MAX_TOKENS, DEFAULT_SEED, Sampling
from replayproxy.check.runner import CheckOptions, run_check
from replayproxy.errors import BadOption
from replayproxy.replay import flavors
from replayproxy.replay.target import describe
from replayproxy.report.checks.report import check_documents, render_checks
from replayproxy.results import CHECK_MAX_REPEAT, CHECK_SUFFIX, CheckTarget

DESCRIPTION_EPILOG = (
    "Prompts are your own evaluation set (JSON lines of OpenAI request bodies, optional `id`\n"
    "and `reference`) or --builtin. They are not production traffic: the proxy never records\n"
    "text. The bearer token, if the targets need one, comes from\n"
    f"{config.API_KEY_SOURCES} (also ${config.API_KEY_ALIASES[0]})."
)
EXAMPLES = (
    "replayproxy check --target prod=http://10.0.0.1:8000 --target cand=http://10.0.0.2:8000 "
    "--prompts eval.jsonl -o check.rpc",
    "replayproxy check --target a=http://127.0.0.1:8000 --target b=http://127.0.0.1:8001 --builtin "
    "--concurrency 4 -o smoke.rpc",
    "replayproxy report check.rpc --gate 'match>=0.95,json_valid>=99%'",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = DESCRIPTION_EPILOG
    add = parser.add_argument
    add(
        "--target",
        action="append",
        required=True,
        metavar="LABEL=URL",
        help="a candidate; give two or more (the first is the baseline)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prompts",
        metavar="FILE.jsonl",
        help="JSON lines of chat or completion request bodies (default: none; or --builtin)",
    )
    source.add_argument("--builtin", action="store_true", help="a small generic prompt set for a smoke check")
    add("-o", "--output", required=True, metavar="CHECK.rpc", help="check result file to write")
    add("--baseline", metavar="LABEL", help="the target the others are compared with (default: the first)")
    add("--repeat", type=int, default=3, metavar="N", help="answers per prompt and target")
    add("--warmup", type=int, default=1, metavar="N", help="prompts sent once, unscored, first")
    add("--concurrency", type=int, default=1, metavar="N", help="requests in flight per target")
    add(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help="max_tokens, unless a prompt sets its own",
    )
    add(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="sampling seed sent to every target",
    )
    add(
        "--model",
        metavar="NAME",
        help="model name sent to every target (default: each one's first served model)",
    )
    add(
        "--flavor",
        action="append",
        default=[],
        metavar="LABEL=NAME",
        help="engine dialect (default: guessed from /v1/models)",
    )
    add("--timeout", type=float, default=300.0, metavar="S", help="per-request timeout in seconds")
    add("--keep-outputs", action="store_true", help="store answer texts in the result, not only their hashes")
    add(
        "--score",
        metavar="CMD",
        help='user scorer: reads {"id","prompt","output","reference"}, prints a number (default: none)',
    )
    add("--api-key", metavar="KEY", help=config.API_KEY_HELP + "; sent to every target")
    add("--quiet", action="store_true", help="no progress lines")


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("repeat", "concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            raise BadOption(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.timeout <= 0:
        raise BadOption("--warmup must be >= 0 and --timeout > 0")
    if args.repeat > CHECK_MAX_REPEAT:  # its file would not be read back
        raise BadOption(f"--repeat must be at most {CHECK_MAX_REPEAT}")


def run(args: argparse.Namespace) -> int:
    _check_numbers(args)
    urls = config.labelled(args.target, "--target")
    forced = config.labelled(args.flavor, "--flavor")
    for label, name in forced.items():
        flavors.get(name)
        if label not in urls:
            raise BadOption(f"--flavor {label}: no such target; targets: {', '.join(urls)}")
    if args.baseline and args.baseline not in urls:
        raise BadOption(f"--baseline {args.baseline!r} is not a target; targets: {', '.join(urls)}")
    output = Path(args.output)
    if output.suffix != CHECK_SUFFIX:
        raise BadOption(f"-o {output}: a check result file ends in {CHECK_SUFFIX}")
    prompts: PromptSet = builtin_prompts() if args.builtin else read_prompts(args.prompts)
    api_key = config.api_key(args.api_key)
    targets, models = asyncio.run(_describe_all(urls, forced, args.model, api_key))
    options = CheckOptions(
        targets=targets,
        prompts=prompts,
        output=output,
        baseline=args.baseline or "",
        models=models,
        sampling=Sampling(seed=args.seed, max_tokens=args.max_tokens),
        repeat=args.repeat,
        warmup=args.warmup,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        keep_outputs=args.keep_outputs,
        score_command=args.score or "",
        api_key=api_key,
    )
    progress = None if args.quiet else _stderr
    with children.signals_interrupt():  # SIGTERM/SIGHUP stop the scorers' groups as Ctrl-C does
        asyncio.run(run_check(options, progress))
    sys.stdout.write(render_checks(check_documents([str(output)]), False, False))
    return 0


def _stderr(line: str) -> None:
    print(f"replayproxy check: {line}", file=sys.stderr)


async def _describe_all(
    urls: dict[str, str], forced: dict[str, str], model: str | None, api_key: str
) -> tuple[tuple[CheckTarget, ...], dict[str, str]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    targets, models = [], {}
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for label, url in urls.items():
            url = url.rstrip("/")
            probe = await describe(session, url, flavors.get("openai"), headers)
            flavor = forced.get(label) or flavors.guess(probe.models)
            info = await describe(session, url, flavors.get(flavor), headers)
            targets.append(CheckTarget(label, url, flavor, info.models, info.engine_version))
            models[label] = model or info.default_model
    return tuple(targets), models
