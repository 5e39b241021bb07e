"""Live replies: prefix-cache hits the trace implies beside the engine's, and exact input lengths.

    python benchmarks/live_replies.py                                     # sim + a locally trained BPE
    python benchmarks/live_replies.py --target http://127.0.0.1:8000 --model tiny-llama \\
        --block 128                                                       # a real vLLM (DEV_MODE=1)

A multi-turn trace in which every later turn is the previous prompt, its reply (`--reply` tokens)
and a new user message (`--new` tokens), for chat and for token-id completions, replayed closed
loop twice in one run: with live replies (the engine's own reply threaded into the next turn) and
with planned ones (synthetic words where the reply stood). Printed per run: requests, errors, the
share with the exact recorded input length, the hits the trace implies at the engine's block size,
the engine's hit counter and their ratio, the hits of later turns beyond the previous prompt
(what only the reply's cached blocks can give; where the engine reports cached tokens per request)
and how many generated token ids the next prompts held as generated (a reply text that
re-tokenizes otherwise ends the cache hit there). The cache is reset before each run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replayproxy import clock  # noqa: E402
from replayproxy.cli import main  # noqa: E402
from replayproxy.launch import run_server  # noqa: E402
from replayproxy.results import load_results  # noqa: E402
from replayproxy.shape import RequestShape, prefix_block_hashes  # noqa: E402
from replayproxy.trace import TraceHeader, write_trace  # noqa: E402
from tests import bpe  # noqa: E402

MS = 1_000_000


def session_trace(path: Path, endpoint: str, model: str, args: argparse.Namespace) -> None:
    """Sessions 2 s apart; turn t has base + t * (reply + new) tokens; production answered in 1 s."""
    shapes = []
    roles = ("su", "au") if endpoint == "chat" else ("", "")
    for s in range(args.sessions):
        offset, units = s * 2000 * MS, list(range(s * 1_000_000, s * 1_000_000 + args.base))
        for t in range(args.turns):
            shapes.append(
                RequestShape(
                    offset_ns=offset, endpoint=endpoint, model=model, input_tokens=len(units),
                    output_tokens=args.reply, max_tokens=args.reply, roles=roles[0] + roles[1] * t,
                    prefix_hashes=prefix_block_hashes(units, 16, b"k"), prefix_units=len(units), status=200,
                    e2e_ns=1000 * MS, session=1000 + s, turn=t, think_ns=100 * MS if t else -1,
                )
            )  # fmt: skip
            offset += 1100 * MS
            units += list(range(units[-1] + 1, units[-1] + 1 + args.reply + args.new))
    header = TraceHeader(start_wall_ns=0, source="synth", block_size=16, block_unit="token")
    shapes.sort(key=lambda shape: shape.offset_ns)
    write_trace(path, header, shapes, mono_ns=clock.now_ns, wall_ns=clock.wall_ns)


def replay(trace: Path, url: str, out: Path, replies: str) -> dict[str, object]:
    command = ["replay", str(trace), "--target", url, "-o", str(out), "--quiet", "--replies", replies]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(command) == 0
        report = io.StringIO()
        with contextlib.redirect_stdout(report):
            assert main(["report", str(out), "--json"]) == 0
    run = load_results([out])[0]
    cache = json.loads(report.getvalue())["runs"][0]["prefix_cache"]
    block = int(cache["engine_block_size"])
    inputs = dict(zip(run.column("index").tolist(), run.column("prompt_tokens").tolist(), strict=True))
    after, cached = run.column("after"), run.column("cached_tokens")
    later = after >= 0
    pairs = zip(after[later].tolist(), cached[later].tolist(), strict=True)
    beyond = [max(0, c - inputs[a] // block * block) for a, c in pairs]
    reported = bool(np.any(cached > 0))  # vLLM reports cached_tokens only with --enable-prompt-tokens-details
    live = (run.extras.get("live_replies") or [{}])[0]
    trip = f"{live['reply_tokens_as_generated']}/{live['reply_tokens']}" if live.get("reply_tokens") else "-"
    summary = run.footer["summary"]
    return {
        "requests": summary["requests"],
        "errors": summary["errors"],
        "input_exact": summary["input_exact"],
        "block": block,
        "implied": cache["implied_hit_tokens"],
        "engine": cache["engine_hit_tokens"],
        "beyond": int(np.sum(beyond)) if reported else "-",
        "round_trip": trip,
        "replies": run.header.pre_run["prompts"].get("replies", ""),
    }


@contextlib.contextmanager
def engine(args: argparse.Namespace, work: Path) -> Iterator[tuple[str, str]]:
    if args.target:
        yield args.target, args.model
        return
    tokenizer = bpe.build(work / "bpe")
    with run_server(["replayproxy.sim", "--port", "0", "--speed", str(args.sim_speed), "--tokenizer",
                     str(tokenizer), "--block-size", str(args.block)]) as sim:  # fmt: skip
        yield sim.url, "sim-llama-3.1-8b"


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="a running engine (default: a sim with a trained BPE tokenizer)")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--base", type=int, default=400, help="first turn's input tokens")
    parser.add_argument("--reply", type=int, default=200, help="output tokens of every turn")
    parser.add_argument("--new", type=int, default=60, help="tokens of each later turn's new message")
    parser.add_argument("--block", type=int, default=16, help="the sim's KV block size")
    parser.add_argument("--sim-speed", type=float, default=5.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = []
        with engine(args, work) as (url, model):
            for endpoint in ("chat", "completions"):
                trace = work / f"{endpoint}.rpt"
                session_trace(trace, endpoint, model, args)
                for replies in ("live", "planned"):
                    out = work / f"{endpoint}-{replies}.rpr"
                    rows.append((endpoint, replies, replay(trace, url, out, replies)))
        print(f"{args.sessions} sessions x {args.turns} turns: {args.base} tokens, then +{args.reply} reply "
              f"+{args.new} new per turn")  # fmt: skip
        print(f"{'trace':12} {'replies':8} {'requests':>8} {'errors':>6} {'input exact':>11} {'block':>5} "
              f"{'implied hits':>12} {'engine hits':>11} {'engine/implied':>14} "
              f"{'hits past prev prompt':>21} {'reply ids sent back as generated':>32}")  # fmt: skip
        for endpoint, replies, r in rows:
            ratio = f"{r['engine'] / r['implied']:.4f}" if r["implied"] and r["engine"] is not None else "-"
            print(f"{endpoint:12} {replies:8} {r['requests']:>8} {r['errors']:>6} {r['input_exact']:>11} "
                  f"{r['block']:>5} {r['implied']:>12} {r['engine']:>11} {ratio:>14} "
                  f"{r['beyond']:>21} {r['round_trip']:>32}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())
