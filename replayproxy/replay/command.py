"""`replayproxy replay TRACE... --target URL -o RESULT.rpr`: options in, one run, a short summary out."""

from __future__ import annotations

import argparse
import sys

from replayproxy.launch import proxy_in_front
from replayproxy.replay import procedure, progress, summary
from replayproxy.replay.arguments import add_arguments as add_arguments  # cli.py's hook
from replayproxy.replay.arguments import options_from_args
from replayproxy.replay.run import replay, run_loop

EXAMPLES = (
    "replayproxy replay traces/ --target http://127.0.0.1:8000 -o vllm.rpr",
    "replayproxy replay prod.rpt --base-url http://host:8000/v1 --model my-model --request-rate 20 -o a.rpr",
    "replayproxy replay prod.rpt --target https://api.example.com --num-prompts 500 --progress log -o b.rpr",
)


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    mode = progress.resolve(options.progress, options.quiet, sys.stderr)
    summaries = run_loop(replay(options, mode, front=proxy_in_front))
    for facts in summaries:
        print(summary.render(facts, options.max_concurrency))
    for repetition, facts in enumerate(summaries, 1):
        failure = summary.failure(facts, options.max_error_rate)
        if failure:
            output = procedure.output_for(options.output, repetition, options.repeat)
            print(f"replayproxy replay: {failure} (results in {output})", file=sys.stderr)
            return 1
    return 0
