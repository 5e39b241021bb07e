"""Replay equals production? Record multi-turn chat through the proxy, replay it against the same engine.

    python benchmarks/replay_vs_production.py --target-kind sim          # a sim with a trained BPE
    python benchmarks/replay_vs_production.py --target http://127.0.0.1:8000 --model tiny-llama
                                                                         # the real vLLM (DEV_MODE=1)

Production: `--sessions` chat sessions from the openai SDK (streaming, `--turns` turns each, every
turn the conversation so far plus a new user message, a shared system prompt per group), started
`--rate` sessions/s apart, through `replayproxy proxy` in front of the engine, the prefix cache
reset first; the engine's prefix-cache hit counter is read around it. Then the recorded trace is
replayed `--repeat` times against the same engine (closed loop, `--replies live` or `planned`, the
cache reset before each run). Printed: the report's fidelity statement (TTFT / TPOT / E2E p50 and
p95, replay vs production, with intervals over the repetitions and requests, and the known
differences), production's prefix-cache hit tokens beside each replay's (from the engine's
counters), and the machine's load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replayproxy.cli import main  # noqa: E402
from replayproxy.launch import run_server  # noqa: E402
from replayproxy.replay.telemetry import scrape_cache_state  # noqa: E402
from tests import bpe  # noqa: E402

WORDS = (
    "the of and to in is that for it as with was on be by this are or from at which but not have an "
    "they you were their one all we can has been more there when will would so if about what no out "
    "system request cache model token engine replay latency batch queue prompt answer session turn"
).split()


@contextlib.contextmanager
def engine(args: argparse.Namespace, work: Path) -> Iterator[tuple[str, str]]:
    if args.target:
        yield args.target.rstrip("/"), args.model
        return
    tokenizer = bpe.build(work / "bpe")
    argv = ["replayproxy.sim", "--port", "0", "--tokenizer", str(tokenizer), "--speed", str(args.sim_speed)]
    with run_server(argv) as sim:
        yield sim.url, "sim-llama-3.1-8b"


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def production(url: str, model: str, args: argparse.Namespace) -> int:
    """The sessions through the proxy at `url`; returns the requests that failed."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    rng = random.Random(args.seed)
    systems = [text(rng, args.system_words) for _ in range(args.groups)]
    failed = 0

    async def session(s: int) -> None:
        nonlocal failed
        await asyncio.sleep(s / args.rate)
        messages = [{"role": "system", "content": systems[s % args.groups]}]
        for _ in range(args.turns):
            messages.append({"role": "user", "content": text(rng, args.user_words)})
            reply = []
            try:
                stream = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=args.max_tokens, stream=True,  # type: ignore[arg-type]
                    stream_options={"include_usage": True},
                )  # fmt: skip
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        reply.append(chunk.choices[0].delta.content)
            except Exception:  # noqa: BLE001 — counted; the session goes on as a client would
                failed += 1
            messages.append({"role": "assistant", "content": "".join(reply)})
            await asyncio.sleep(rng.expovariate(1 / args.think))

    await asyncio.gather(*(session(s) for s in range(args.sessions)))
    await client.close()
    return failed


def reset(url: str) -> None:
    request = urllib.request.Request(f"{url}/reset_prefix_cache", method="POST")
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=30):
        pass


def hits(url: str) -> int | None:
    value = scrape_cache_state(f"{url}/metrics").get("prefix_hits")
    return int(value) if value is not None else None


def cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"replayproxy {argv[0]} exited {code}")
    return out.getvalue()


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="a running engine's URL (default: --target-kind sim)")
    parser.add_argument(
        "--target-kind", choices=("sim",), default="sim", help="what to start without --target"
    )
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rate", type=float, default=2.0, help="sessions started per second")
    parser.add_argument("--think", type=float, default=0.5, help="mean think time between turns, s")
    parser.add_argument("--groups", type=int, default=4, help="distinct system prompts")
    parser.add_argument("--system-words", type=int, default=200)
    parser.add_argument("--user-words", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--replies", choices=("live", "planned"), default="live")
    parser.add_argument(
        "--via-proxy",
        action="store_true",
        help="replay through a proxy as production went (replay --via-proxy)",
    )
    parser.add_argument("--sim-speed", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with engine(args, work) as (url, model):
            reset(url)
            before = hits(url)
            with run_server(["replayproxy", "proxy", "--upstream", url, "--listen", "127.0.0.1:0",
                             "--admin-listen", "", "--trace-dir", str(work / "trace")]) as proxy:  # fmt: skip
                failed = asyncio.run(production(proxy.url, model, args))
            after = hits(url)
            produced = after - before if before is not None and after is not None else None
            runs, replayed = [], []
            for i in range(args.repeat):
                out = work / f"run{i + 1}.rpr"
                via = ["--via-proxy", str(work / "via")] if args.via_proxy else []
                cli("replay", str(work / "trace"), "--target", url, "-o", str(out), "--quiet",
                    "--replies", args.replies, "--label", "replay", *via)  # fmt: skip
                runs.append(str(out))
                report = json.loads(cli("report", str(out), "--json"))
                replayed.append(report["runs"][0]["prefix_cache"] or {})
        report = json.loads(cli("report", *runs, "--baseline", str(work / "trace"), "--json"))
        text_report = cli("report", *runs, "--baseline", str(work / "trace"))
    start = text_report.find("Fidelity")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.sessions} sessions x {args.turns} turns at {args.rate}/s, {args.replies} replies, "
          f"{args.repeat} replays{' via a proxy' if args.via_proxy else ''}; production requests failed: "
          f"{failed}; load average {load}")  # fmt: skip
    print(text_report[start : text_report.find("\n\n", text_report.find("known differences", start))])
    print(f"prefix-cache hit tokens, engine counters: production {produced}")
    for i, cache in enumerate(replayed, 1):
        engine_hits = cache.get("engine_hit_tokens")
        share = (
            f" ({engine_hits / produced:.1%} of production's)" if produced and engine_hits is not None else ""
        )
        print(f"  replay {i}: {engine_hits}{share}; implied {cache.get('implied_hit_tokens')}")
    for f in report["fidelity"]:
        print("within 5 % on every figure:", all(abs(g["difference"] or 0) <= 0.05 for g in f["figures"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())
