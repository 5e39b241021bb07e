"""`replayproxy synth`: write a synthetic trace from a few workload parameters (see synthetic.py),
or from a workload profile fitted to a real trace (`--profile`, see formats/profile_synth.py).

Same options and seed give a byte-identical file: the header's times are 0 and the hash key is
derived from the seed.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterable
from dataclasses import replace

from replayproxy.shape import RequestShape
from replayproxy.synthetic import LengthDist, SynthSpec, generate, header_for, parse_arrival
from replayproxy.trace import TraceHeader, write_trace

DIST_HELP = "lognormal:mean=M,sigma=S[,min=A,max=B] | fixed:N | uniform:A,B (tokens)"


EXAMPLES = (
    "replayproxy synth -o synthetic.rpt --requests 1000 --rate 20 --prefix-groups 4 --prefix-len 512",
    "replayproxy synth -o bursty.rpt --duration 600 --arrival gamma:3 --sessions-share 0.3 --seed 7",
    "replayproxy synth -o scaled.rpt --profile profile.json --rate-scale 2 --duration 300",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write (.rpt)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--requests", type=int, metavar="N", help="number of requests (default: 1000)")
    size.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="trace length in seconds, instead of --requests (default: none)",
    )
    parser.add_argument("--rate", type=float, default=10.0, metavar="R", help="mean requests per second")
    parser.add_argument(
        "--arrival",
        default="poisson",
        metavar="poisson|gamma:CV",
        help="inter-arrival process; gamma with CV > 1 gives bursts",
    )
    parser.add_argument(
        "--input-len", default="lognormal:mean=1000,sigma=0.8", metavar="DIST", help=DIST_HELP
    )
    parser.add_argument(
        "--output-len", default="lognormal:mean=250,sigma=0.8", metavar="DIST", help=DIST_HELP
    )
    parser.add_argument("--prefix-groups", type=int, default=0, metavar="G", help="shared system prompts")
    parser.add_argument("--prefix-len", type=int, default=0, metavar="L", help="tokens per system prompt")
    parser.add_argument(
        "--sessions-share",
        type=float,
        default=0.0,
        metavar="F",
        help="share of requests in multi-turn sessions",
    )
    parser.add_argument("--turns", default="uniform:2,6", metavar="DIST", help="turns per session")
    parser.add_argument(
        "--think", type=float, default=5.0, metavar="S", help="mean pause between turns, seconds"
    )
    parser.add_argument(
        "--endpoint", choices=("chat", "completions"), default="chat", help="API the requests use"
    )
    parser.add_argument(
        "--stream-share", type=float, default=1.0, metavar="F", help="share of streaming requests"
    )
    parser.add_argument("--model", default="synth", help="model name written in each request")
    parser.add_argument("--seed", type=int, default=0, help="random seed; equal seeds give identical files")
    profile = parser.add_argument_group("from a profile (`replayproxy export --format profile`)")
    profile.add_argument(
        "--profile",
        metavar="PROFILE.json",
        help="sample this profile instead; uses --duration, --requests, --seed (default: none)",
    )
    profile.add_argument(
        "--rate-scale", type=float, default=1.0, metavar="K", help="multiply the request rate"
    )
    profile.add_argument(
        "--length-scale", type=float, default=1.0, metavar="K", help="multiply token lengths"
    )


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
    if args.profile:
        header, shapes = from_profile(args)
    else:
        spec = spec_from_args(args)
        header, shapes = header_for(spec), generate(spec)
    count = write_trace(args.output, header, shapes, mono_ns=lambda: 0, wall_ns=lambda: 0)
    print(f"wrote {count} requests to {args.output}")
    return 0


def from_profile(args: argparse.Namespace) -> tuple[TraceHeader, Iterable[RequestShape]]:
    """A profile's shapes, scaled; imported lazily because profiles live in the formats package."""
    from replayproxy.formats.profile_synth import load_profile, profile_header, shapes_from_profile

    profile = load_profile(args.profile)
    shapes: Iterable[RequestShape] = shapes_from_profile(
        profile,
        rate_scale=args.rate_scale,
        length_scale=args.length_scale,
        duration_s=args.duration,
        seed=args.seed,
    )
    if args.requests is not None:
        shapes = itertools.islice(shapes, args.requests)
    base = profile_header(profile)  # carries the hash scheme of synthesized (not keyed-text) hashes
    synth = {"profile": str(args.profile), "rate_scale": args.rate_scale, "length_scale": args.length_scale,
             "seed": args.seed}  # fmt: skip
    header = replace(base, recorder="replayproxy synth", extra={**base.extra, "synth": synth})
    return header, shapes
