"""`replayproxy synth`: write a synthetic trace from a few workload parameters (see synthetic.py).

Same options and seed give a byte-identical file: the header's times are 0 and the hash key is
derived from the seed.
"""

from __future__ import annotations

import argparse

from replayproxy.synthetic import LengthDist, SynthSpec, generate, header_for, parse_arrival
from replayproxy.trace import write_trace

DIST_HELP = "lognormal:mean=M,sigma=S[,min=A,max=B] | fixed:N | uniform:A,B (tokens)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write (.rpt)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--requests", type=int, metavar="N", help="number of requests (default 1000)")
    size.add_argument("--duration", type=float, metavar="S", help="trace length in seconds instead")
    parser.add_argument("--rate", type=float, default=10.0, metavar="R", help="mean requests per second (10)")
    parser.add_argument(
        "--arrival", default="poisson", metavar="poisson|gamma:CV",
        help="inter-arrival process; gamma with CV > 1 gives bursts (poisson)",
    )
    parser.add_argument("--input-len", default="lognormal:mean=1000,sigma=0.8", metavar="DIST", help=DIST_HELP)
    parser.add_argument("--output-len", default="lognormal:mean=250,sigma=0.8", metavar="DIST", help=DIST_HELP)
    parser.add_argument("--prefix-groups", type=int, default=0, metavar="G", help="shared system prompts (0)")
    parser.add_argument("--prefix-len", type=int, default=0, metavar="L", help="tokens per system prompt")
    parser.add_argument(
        "--sessions-share", type=float, default=0.0, metavar="F", help="share of requests in multi-turn sessions (0)"
    )
    parser.add_argument("--turns", default="uniform:2,6", metavar="DIST", help="turns per session (uniform:2,6)")
    parser.add_argument("--think", type=float, default=5.0, metavar="S", help="mean pause between turns (5 s)")
    parser.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    parser.add_argument("--stream-share", type=float, default=1.0, metavar="F", help="share of streaming requests (1)")
    parser.add_argument("--model", default="synth", help="model name written in each request (synth)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; equal seeds give identical files (0)")


def spec_from_args(args: argparse.Namespace) -> SynthSpec:
    return SynthSpec(
        requests=args.requests,
        duration_s=args.duration,
        rate_rps=args.rate,
        arrival_cv=parse_arrival(args.arrival),
        input_len=LengthDist.parse(args.input_len),
        output_len=LengthDist.parse(args.output_len),
        prefix_groups=args.prefix_groups,
        prefix_len_tokens=args.prefix_len,
        sessions_share=args.sessions_share,
        turns=LengthDist.parse(args.turns),
        think_s=args.think,
        endpoint=args.endpoint,
        stream_share=args.stream_share,
        model=args.model,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    count = write_trace(args.output, header_for(spec), generate(spec), mono_ns=lambda: 0, wall_ns=lambda: 0)
    print(f"wrote {count} requests to {args.output}")
    return 0
