"""Exact workload: input/output length exactness and prefix-cache hits, implied by the trace vs the engine's.

    python benchmarks/exact_workload.py                                   # sim + a locally trained BPE
    python benchmarks/exact_workload.py --target http://127.0.0.1:8000 --model tiny-llama \\
        --tokenizer ~/.cache/real-engine/tiny-llama                       # a real vLLM (DEV_MODE=1)

Three traces: a prefix-heavy chat trace with multi-turn sessions, a prefix-heavy completions trace
(token ids), and multi-turn conversations with live replies recorded through the proxy. Each is
replayed (cache reset before) and the script prints the shares of requests with the trace's exact
input and output length and the prefix-cache hit tokens the trace implies at the engine's block
size beside the engine's counter. Then it times preparing 100,000 chat requests with the local
tokenizer (`--tokenizer`, default the trained one). About 3 minutes against the sim.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replayproxy import trace  # noqa: E402
from replayproxy.cli import main  # noqa: E402
from replayproxy.launch import run_server  # noqa: E402
from replayproxy.replay import flavors, plan, prompt_parts  # noqa: E402
from replayproxy.replay.hf_tokenizer import LocalTokenizer  # noqa: E402
from replayproxy.replay.tokenizer_setup import chat_keys  # noqa: E402
from replayproxy.results import load_results  # noqa: E402
from tests import bpe, conversations  # noqa: E402
from tests.replay import traces  # noqa: E402


def synthetic(path: Path, model: str, endpoint: str, requests: int, rate: float) -> Path:
    return traces.prefix_heavy(
        path, endpoint, model=model, requests=requests, rate_rps=rate, prefix_groups=4,
        prefix_len_tokens=512, input_len="uniform:520,900", output_len="uniform:4,16",
    )  # fmt: skip


def replay(trace_path: Path, url: str, out: Path) -> dict[str, object]:
    code = main(["replay", str(trace_path), "--target", url, "-o", str(out), "--quiet"])
    assert code == 0, code
    run = load_results([out])[0]
    report = out.with_suffix(".json")
    with report.open("w") as handle, contextlib.redirect_stdout(handle):
        assert main(["report", str(out), "--json"]) == 0
    cache = json.loads(report.read_text())["runs"][0]["prefix_cache"]
    summary = run.footer["summary"]
    return {
        "requests": summary["requests"],
        "errors": summary["errors"],
        "input_exact": summary["input_exact"],
        "output_exact": summary["output_exact"],
        "lengths": run.header.pre_run["prompts"]["lengths"],
        "block": cache["engine_block_size"],
        "implied": cache["implied_hit_tokens"],
        "engine": cache["engine_hit_tokens"],
    }


def record(url: str, model: str, work: Path) -> Path:
    with run_server(
        ["replayproxy", "proxy", "--upstream", url, "--listen", "127.0.0.1:0", "--admin-listen", "",
         "--trace-dir", str(work / "recorded")]
    ) as proxy:  # fmt: skip
        asyncio.run(conversations.send(proxy.url, model, conversations=16, turns=3))
    return sorted((work / "recorded").glob("*.rpt"))[0]


@contextlib.contextmanager
def engine(args: argparse.Namespace, tokenizer: Path) -> Iterator[tuple[str, str]]:
    if args.target:
        yield args.target, args.model
        return
    with run_server(
        ["replayproxy.sim", "--port", "0", "--speed", "20", "--tokenizer", str(tokenizer)]
    ) as sim:
        yield sim.url, traces.SIM_MODEL


def preparation_rate(tokenizer_path: Path, work: Path, requests: int) -> tuple[float, float]:
    path = synthetic(work / "big.rpt", "m", "chat", requests, 200.0)
    cols = trace.load(path)
    rows = np.arange(len(cols))
    tokenizer = LocalTokenizer(tokenizer_path)
    started = time.perf_counter()
    book = asyncio.run(prompt_parts.measure(tokenizer, chat_keys(cols, rows)))
    measured = time.perf_counter() - started
    prepared = plan.prepare(cols, rows, flavors.get("vllm"), plan.PlanOptions(book=book))
    total = time.perf_counter() - started
    assert len(prepared) == requests
    return measured, total


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="a running engine (default: a sim with a trained BPE tokenizer)")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--tokenizer", help="tokenizer.json or model directory for the preparation timing")
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--prepare", type=int, default=100_000, help="requests to prepare in the timing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trained = bpe.build(work / "bpe")
        tokenizer = Path(args.tokenizer).expanduser() if args.tokenizer else trained
        rows = []
        with engine(args, trained) as (url, model):
            for name, endpoint in (
                ("prefix-heavy chat", "chat"),
                ("prefix-heavy completions", "completions"),
            ):
                path = synthetic(work / f"{endpoint}.rpt", model, endpoint, args.requests, args.rate)
                rows.append((name, replay(path, url, work / f"{endpoint}.rpr")))
            rows.append(("recorded multi-turn chat", replay(record(url, model, work), url, work / "rec.rpr")))
        print(f"{'trace':26} {'requests':>8} {'errors':>6} {'input exact':>11} {'output exact':>12} "
              f"{'block':>5} {'implied hits':>12} {'engine hits':>11} {'engine/implied':>14}")  # fmt: skip
        for name, r in rows:
            ratio = f"{r['engine'] / r['implied']:.4f}" if r["implied"] and r["engine"] is not None else "-"
            counts = f"{r['requests']:>8} {r['errors']:>6} {r['input_exact']:>11} {r['output_exact']:>12}"
            print(f"{name:26} {counts} {r['block']:>5} {r['implied']:>12} {r['engine']:>11} {ratio:>14}")
        measured, total = preparation_rate(tokenizer, work, args.prepare)
        print(f"prepare {args.prepare} chat requests with {tokenizer.name}: measuring {measured:.2f} s, "
              f"total {total:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())
