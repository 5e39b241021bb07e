"""Replay at scale: time to first request, peak memory, preparation rate, schedule lag, streamed vs up front.

    python benchmarks/replay_scale.py [--conversation ../shared/data/traces/conversation_trace.jsonl]
        [--speeds 1,10] [--run-seconds 120] [--million 1000000] [--million-rate 500]
        [--million-workers 2] [--million-seconds 60] [--lag-rate 500] [--lag-seconds 10]
        [--rate-requests 20000] [--skip conversation,sessions,million,lag,rate,shared]

Every replay is a real `replayproxy replay` process (flavor vllm: token-id completions) against a
fast local SSE server (benchmarks/replay_fidelity.py's), interrupted with Ctrl-C after
`--run-seconds` when the trace is longer, so the whole trace is planned but only its start is sent. For
each it prints the time from launch to the first measured request, the peak RSS of the replayer's
process tree (sender, preparer, workers; sampled every 20 ms), the schedule lag and the requests
whose body was late. Cases: the Mooncake conversation trace at each `--speeds` value, streamed and
prepared up front; the same trace replayed closed loop (`--sessions closed`), its conversations
linked as Mooncake's hash ids show them (a request whose blocks continue all the whole blocks of an
earlier one is that one's next turn), with the turns that overlapped the turn before them and the
think-time error beside the figures above; a synthetic trace of `--million` requests (1k-token
prompts, shared 512-token system prompts) with `--million-workers` workers, streamed only (up front
it would need the whole trace's bodies in memory, estimated from the per-request size); the schedule
lag at `--lag-rate` req/s on one pinned core with 1k-token prompts, streamed vs up front; and the
preparation rate per core (CPU time) for 1k-token chat and token-id completion prompts, approximate
and exact (a locally trained BPE tokenizer). `shared` (no timing, so it may run on a busy machine)
counts how many of the window's bytes are prefix pieces equal to an earlier body's, the most that
storing shared pieces once (scatter-gather writes) could save.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replayproxy import clock, trace  # noqa: E402
from replayproxy.replay import flavors, plan, prompt_parts  # noqa: E402
from replayproxy.replay.progress import LOG_EVERY_S  # noqa: E402
from replayproxy.replay.tokenizer_setup import chat_keys  # noqa: E402
from replayproxy.results import load_results  # noqa: E402
from replayproxy.shape import RequestShape  # noqa: E402
from replayproxy.trace import TraceHeader, write_trace  # noqa: E402

FIDELITY = Path(__file__).with_name("replay_fidelity.py")
SHARED_TRACE = ROOT.parent / "shared" / "data" / "traces" / "conversation_trace.jsonl"
START_TIMEOUT_S = 600.0  # launch to the first progress line (the million prepared, however slowly)
STOP_TIMEOUT_S = 60.0  # a stop to the exit (the result file written), before the next, harder signal


# --------------------------------------------------------------------------- traces


def synthetic_trace(
    path: Path, requests: int, rate: float, endpoint: str = "completions", seed: int = 1
) -> Path:
    """Poisson arrivals, 1k-token prompts: a 512-token system prompt of one of 8, then 488 own tokens."""
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1e9 / rate, requests)).astype(np.int64).tolist()
    groups = rng.integers(1, 9, requests).tolist()
    roles = "su" if endpoint == "chat" else ""
    shapes = (
        RequestShape(offset, endpoint, "bench", True, 1000, 16, roles=roles, prefix_hashes=(group,))
        for offset, group in zip(offsets, groups, strict=True)
    )
    header = TraceHeader(start_wall_ns=0, source="synth", block_size=512, block_unit="token")
    write_trace(path, header, shapes, mono_ns=clock.now_ns, wall_ns=clock.wall_ns)
    return path


def conversation_trace(source: Path, work: Path) -> Path:
    """The Mooncake trace imported, as token-id completions (the form vLLM takes it in fastest)."""
    out = work / "conversation.rpt"
    if not out.exists():
        imported = work / "conversation-chat.rpt"
        command = [sys.executable, "-m", "replayproxy", "import", str(source), "--format", "mooncake",
                   "-o", str(imported), "--model", "bench", "--quiet"]  # fmt: skip
        subprocess.run(command, check=True, cwd=ROOT)
        cols = trace.load(imported)
        columns = {
            **cols.scalar,
            "endpoint": "completions",  # one value for every row
            "roles": "",
            "prefix_hashes": (cols.prefix_hashes, np.diff(cols.prefix_index)),
            "chunk_gaps_us": (cols.chunk_gaps_us, np.diff(cols.chunk_index)),
        }
        trace.write_columns(out, cols.headers[0], columns, len(cols), wall_ns=clock.wall_ns)
    return out


def with_sessions(path: Path, work: Path) -> Path:
    """`path` with session links: a request whose prefix blocks continue every whole block of an
    earlier request (hash chains: equal hashes at a position mean equal prefixes) is a later turn of
    that request's conversation; its think time is left to the replayer (the recorded gap)."""
    out = work / f"{path.stem}-sessions.rpt"
    if out.exists():
        return out
    cols = trace.load(path)
    block = plan.block_tokens(cols)
    owner: dict[int, int] = {}  # chained hash of a request's last whole block -> that request
    session = np.zeros(len(cols), np.uint64)
    turn = np.zeros(len(cols), np.int64)
    for row in range(len(cols)):
        hashes = cols.prefix_hashes[cols.prefix_index[row] : cols.prefix_index[row + 1]].tolist()
        previous = next((owner[h] for h in reversed(hashes) if h in owner), None)
        if previous is not None:
            session[row] = session[previous] or np.uint64(previous + 1)
            session[previous] = session[row]
            turn[row] = turn[previous] + 1
        whole = int(cols.input_tokens[row]) // block
        if whole >= 2 and whole <= len(hashes):
            owner[hashes[whole - 1]] = row
    columns = {
        **cols.scalar,
        "session": session,
        "turn": turn,
        "think_ns": np.full(len(cols), -1, np.int64),
        "prefix_hashes": (cols.prefix_hashes, np.diff(cols.prefix_index)),
        "chunk_gaps_us": (cols.chunk_gaps_us, np.diff(cols.chunk_index)),
    }
    trace.write_columns(out, cols.headers[0], columns, len(cols), wall_ns=clock.wall_ns)
    return out


def session_fidelity(out: Path) -> dict[str, float]:
    """Later turns, those sent before the turn they continue ended, and the think-time error (ms)."""
    result = load_results([out])[0]
    index, sent, e2e = (result.column(c) for c in ("index", "sent_ns", "e2e_ns"))
    after, think = result.column("after"), result.column("think_ns")
    end_of = dict(zip(index.tolist(), (sent + e2e).tolist(), strict=True))
    later = (after >= 0) & (sent >= 0) & np.isin(after, index)
    ends = np.array([end_of[a] for a in after[later].tolist()], np.int64)
    error = np.abs(sent[later] - ends - think[later]) / 1e6
    p50, p99 = np.percentile(error, [50, 99]) if len(error) else (np.nan, np.nan)
    return {"later": int(later.sum()), "overlapping": int((sent[later] < ends).sum()), "think_p50": p50,
            "think_p99": p99}  # fmt: skip


# --------------------------------------------------------------------------- measuring one replay


def process_tree(pid: int) -> list[int]:
    found = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
            for child in children:
                found += process_tree(int(child))
    except OSError:
        pass
    return found


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def pinned(cpu: int | None) -> dict[str, object]:
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return {}
    return {"preexec_fn": lambda: os.sched_setaffinity(0, {cpu})}


def interruptible(cpu: int | None) -> dict[str, object]:
    """`pinned`, with SIGINT back to its default: a benchmark started as a background job of a shell
    without job control has SIGINT ignored, and the replay would inherit that and never stop on it."""

    def start() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})

    return {"preexec_fn": start}


def replay(
    trace_path: Path, url: str, out: Path, run_seconds: float, *extra: str, cpu: int | None = None
) -> dict[str, float]:
    """One replay; returns time to first request (s), peak RSS (MB), lag p50/p99/max (ms), counts.

    Stopped (Ctrl-C) `run_seconds` after its clock started, which its first progress line
    (`--progress log`, LOG_EVERY_S into the run) tells."""
    command = [sys.executable, "-m", "replayproxy", "replay", str(trace_path), "--target", url,
               "-o", str(out), "--flavor", "vllm", "--no-calibrate", "--progress", "log",
               *extra]  # fmt: skip
    launched_wall = clock.wall_ns()
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **interruptible(cpu)
    )  # type: ignore[call-overload]
    running = threading.Event()
    errors: list[str] = []

    def read_errors() -> None:
        for text in process.stderr:
            errors.append(text)
            if text.startswith("replay:"):
                running.set()

    reader = threading.Thread(target=read_errors, daemon=True)
    reader.start()
    peak = 0
    stop_at = 0
    give_up = clock.now_ns() + int(START_TIMEOUT_S * 1e9)  # never wait for a stuck replay in silence
    stops = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]  # each STOP_TIMEOUT_S after the last
    stuck, started = "", False
    while process.poll() is None:
        peak = max(peak, sum(rss_bytes(pid) for pid in process_tree(process.pid)))
        now = clock.now_ns()
        if running.is_set() and not started:
            started, give_up = True, 1 << 62
            if run_seconds:
                stop_at = now + int(max(run_seconds - LOG_EVERY_S, 0) * 1e9)
        if now >= give_up:
            if not stops:
                break  # not even SIGKILL ended it: said below
            stuck = stuck or (f"no progress line {START_TIMEOUT_S:g} s after launch" if not stop_at
                              else f"still running {STOP_TIMEOUT_S:g} s after SIGINT")  # fmt: skip
            stop_at = now
        if stop_at and now >= stop_at:
            stop = stops.pop(0)
            if stuck:
                print(f"  replay: {stuck}: {stop.name}", flush=True)
            process.send_signal(stop)  # SIGINT: the results so far are written, the run marked partial
            stop_at, give_up = 1 << 62, now + int(STOP_TIMEOUT_S * 1e9)
        time.sleep(0.02)
    reader.join(5)
    err = "".join(errors)
    if stuck or process.poll() is None:
        raise RuntimeError(f"replay {stuck} (exit {process.poll()}): {err[-800:]}")
    if not out.exists():
        if process.returncode == 130:  # interrupted with --workers: no result file (yet) to read
            return {"launched_wall_ns": launched_wall, "peak_rss_mb": peak / 2**20}
        raise RuntimeError(f"replay failed (exit {process.returncode}): {err[-800:]}")
    result = load_results([out])[0]
    sent = result.column("sent_ns")
    ok = sent >= 0
    lag = (sent[ok] - result.column("scheduled_ns")[ok]) / 1e6
    first_wall = result.header.start_wall_ns + int(sent[ok].min()) if ok.any() else launched_wall
    p50, p99, top = np.percentile(lag, [50, 99, 100]) if len(lag) else (np.nan,) * 3
    return {
        "launched_wall_ns": launched_wall,
        "ttfr_s": (first_wall - launched_wall) / 1e9,
        "peak_rss_mb": peak / 2**20,
        "sent": int(ok.sum()),
        "late": int(result.column("prepared_late").sum()),
        "errors": int(((result.column("error") != "") & (result.column("error") != "client_cancel")).sum()),
        "lag_p50": p50,
        "lag_p99": p99,
        "lag_max": top,
    }


def line(name: str, m: dict[str, float]) -> str:
    return (
        f"{name:44s} first request {m['ttfr_s']:6.2f} s  peak RSS {m['peak_rss_mb']:7.0f} MB  "
        f"sent {m['sent']:7d}  errors {m['errors']:5d}  late {m['late']:5d}  "
        f"lag ms p50 {m['lag_p50']:6.3f} p99 {m['lag_p99']:7.3f} max {m['lag_max']:8.3f}"
    )


class Server:
    """The fidelity benchmark's fast SSE server (one chunk per answer), in its own process."""

    def __init__(self, work: Path, cpu: int | None) -> None:
        self.port_file, self.truth_file = work / "port", work / "truth.json"
        for stale in (self.port_file, self.truth_file):
            stale.unlink(missing_ok=True)
        command = [sys.executable, str(FIDELITY), "--chunks", "1", "--chunk-gap-ms", "1", "--serve",
                   str(self.port_file), str(self.truth_file)]  # fmt: skip
        self.process = subprocess.Popen(command, **pinned(cpu))  # type: ignore[call-overload]
        while not self.port_file.exists() or not self.port_file.read_text():
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port_file.read_text()}"

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: object) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# --------------------------------------------------------------------------- cases


def conversation_case(args: argparse.Namespace, work: Path) -> None:
    if not args.conversation.exists():
        print(f"conversation trace: {args.conversation} not found, skipped")
        return
    path = conversation_trace(args.conversation, work)
    cols = trace.load(path)
    tokens = int(cols.input_tokens.sum()) / 1e6
    minutes = (cols.offset_ns[-1] - cols.offset_ns[0]) / 60e9
    print(f"conversation trace: {len(cols)} requests, {tokens:.0f} M input tokens, {minutes:.0f} min")
    for speed in args.speeds:
        for mode in ("stream", "upfront"):
            with Server(work, args.server_cpu) as server:
                measured = replay(path, server.url, work / f"conv-{speed}-{mode}.rpr", args.run_seconds,
                                  "--speed", f"{speed:g}", "--prepare", mode)  # fmt: skip
            print(line(f"  --speed {speed:g} --prepare {mode}", measured))


def sessions_case(args: argparse.Namespace, work: Path) -> None:
    """The conversation trace closed loop: each later turn due at the previous turn's end plus the
    recorded gap, its body streamed (or prepared up front) like an open-loop run's."""
    if not args.conversation.exists():
        print(f"conversation trace: {args.conversation} not found, skipped")
        return
    path = with_sessions(conversation_trace(args.conversation, work), work)
    cols = trace.load(path)
    print(f"conversation trace closed loop: {int((cols.turn > 0).sum())} of {len(cols)} requests are later "
          f"turns of {len(np.unique(cols.session[cols.session != 0]))} conversations")  # fmt: skip
    for speed in args.speeds:
        for mode in ("stream", "upfront"):
            out = work / f"sessions-{speed}-{mode}.rpr"
            with Server(work, args.server_cpu) as server:
                measured = replay(path, server.url, out, args.run_seconds, "--speed", f"{speed:g}",
                                  "--prepare", mode, "--sessions", "closed")  # fmt: skip
            turns = session_fidelity(out)
            print(line(f"  closed --speed {speed:g} --prepare {mode}", measured))
            print(f"    later turns {turns['later']}, overlapping {turns['overlapping']}, think error ms "
                  f"p50 {turns['think_p50']:.3f} p99 {turns['think_p99']:.3f}")  # fmt: skip


def million_case(args: argparse.Namespace, work: Path) -> None:
    """Interrupted with --workers, a run leaves no result file: the first request and the count
    come from the server's log (text completions, so no token-id probe precedes the run)."""
    path = synthetic_trace(work / f"million-{args.million}.rpt", args.million, args.million_rate)
    server = Server(work, args.server_cpu)
    with server:
        measured = replay(path, server.url, work / "million.rpr", args.million_seconds,
                          "--workers", str(args.million_workers), "--flavor", "openai")  # fmt: skip
    arrivals = np.array([arrival for arrival, _ in json.loads(server.truth_file.read_text())], np.int64)
    first = (int(arrivals.min()) - measured["launched_wall_ns"]) / 1e9 if len(arrivals) else float("nan")
    per_request = _wire_bytes(path)
    print(
        f"{f'{args.million} requests, --workers {args.million_workers}':44s} first request {first:6.2f} s  "
        f"peak RSS {measured['peak_rss_mb']:7.0f} MB  sent {len(arrivals):7d} in {args.million_seconds:g} s"
    )
    print(f"  (up front the bodies alone would take {args.million * per_request / 2**30:.1f} GiB: "
          f"{per_request / 1024:.1f} KiB each)")  # fmt: skip


def _wire_bytes(path: Path) -> float:
    cols = trace.load(path)
    sample = plan.prepare(cols, np.arange(min(200, len(cols))), flavors.get("vllm"), plan.PlanOptions())
    return float(np.mean([len(p.body) for p in sample]))


def lag_case(args: argparse.Namespace, work: Path) -> None:
    path = synthetic_trace(
        work / f"lag-{args.lag_rate:g}-{args.lag_seconds:g}.rpt",
        int(args.lag_rate * args.lag_seconds),
        args.lag_rate,
    )
    print(f"schedule lag at {args.lag_rate:g} req/s, 1k-token prompts, replayer on cpu {args.client_cpu} "
          "(its preparer shares that core at a lower priority)")  # fmt: skip
    for mode in ("stream", "upfront"):
        with Server(work, args.server_cpu) as server:
            measured = replay(
                path, server.url, work / f"lag-{mode}.rpr", 0, "--prepare", mode, cpu=args.client_cpu
            )
        print(line(f"  --prepare {mode}", measured))


def rate_case(args: argparse.Namespace, work: Path) -> None:
    """Preparation rate per core: CPU time of planning and serializing, no I/O."""
    from replayproxy.replay.hf_tokenizer import LocalTokenizer
    from tests import bpe

    tokenizer = LocalTokenizer(bpe.build(work / "bpe"))
    print(f"preparation rate, {args.rate_requests} requests of 1k-token prompts (CPU time, one core)")
    for endpoint in ("chat", "completions"):
        path = synthetic_trace(work / f"rate-{endpoint}.rpt", args.rate_requests, 500.0, endpoint)
        cols = trace.load(path)
        rows = np.arange(len(cols))
        book = asyncio.run(prompt_parts.measure(tokenizer, chat_keys(cols, rows)))
        for name, options in (("approximate", plan.PlanOptions()), ("exact", plan.PlanOptions(book=book))):
            started = time.process_time()
            count = sum(1 for _ in plan.Planner(cols, rows, flavors.get("vllm"), options))
            rate = count / (time.process_time() - started)
            kind = "token-id completions" if endpoint == "completions" else "chat"
            print(f"  {kind:22s} {name:12s} {rate:8.0f} requests/s")


def shared_case(args: argparse.Namespace, work: Path) -> None:
    """Bytes of each body equal to its prefix donor's body (the request whose prefix it copies),
    and, for a window of --prepare-window's default 20 s at each speed (and at ten times the last,
    a service ten times as busy), the bytes held against those a store of shared pieces would hold
    (each piece once per conversation root, at its longest)."""
    if not args.conversation.exists():
        print(f"conversation trace: {args.conversation} not found, skipped")
        return
    cols = trace.load(conversation_trace(args.conversation, work))
    planner = plan.Planner(cols, np.arange(len(cols)), flavors.get("vllm"), plan.PlanOptions())
    donors, last_use = planner._donor, planner._last_use
    size, shared = np.zeros(len(cols), np.int64), np.zeros(len(cols), np.int64)
    root, kept = np.arange(len(cols)), {}
    for position in range(len(cols)):
        body = planner.next().body
        size[position], donor = len(body), int(donors[position])
        if donor >= 0:
            other = kept[donor] if last_use[donor] > position else kept.pop(donor)
            n = min(len(body), len(other))
            differ = np.flatnonzero(np.frombuffer(body, np.uint8, n) != np.frombuffer(other, np.uint8, n))
            shared[position], root[position] = int(differ[0]) if len(differ) else n, root[donor]
        if last_use[position] > position:
            kept[position] = body
    print(f"shared prefix bytes: {shared.sum() / size.sum():.1%} of {size.sum() / 2**20:.0f} MiB of bodies "
          "equal their donor's prefix")  # fmt: skip
    seconds = cols.offset_ns / 1e9
    for speed in [*args.speeds, args.speeds[-1] * 10]:
        held, saved = [], []
        t = seconds / speed
        for start in np.arange(t[0], max(t[-1] - 20.0, t[0]) + 1e-9, 5.0):
            inside = (t >= start) & (t < start + 20.0)
            keys, pieces = root[inside], shared[inside]
            order = np.argsort(keys, kind="stable")
            firsts = np.flatnonzero(np.r_[True, keys[order][1:] != keys[order][:-1]]) if len(keys) else []
            stored = int(np.maximum.reduceat(pieces[order], firsts).sum()) if len(keys) else 0
            held.append(int(size[inside].sum()))
            saved.append(int(pieces.sum()) - stored)
        print(f"  --speed {speed:g}: a 20 s window holds {np.mean(held) / 2**20:6.1f} MiB on average "
              f"({max(held) / 2**20:.1f} at most); shared pieces stored once would save "
              f"{np.mean(saved) / 2**20:6.1f} MiB ({sum(saved) / max(sum(held), 1):.0%})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversation", type=Path, default=SHARED_TRACE)
    parser.add_argument("--speeds", type=lambda s: [float(v) for v in s.split(",")], default=[1.0, 10.0])
    parser.add_argument(
        "--run-seconds", type=float, default=120.0, help="interrupt a longer replay after this"
    )
    parser.add_argument("--million", type=int, default=1_000_000)
    parser.add_argument("--million-rate", type=float, default=500.0)
    parser.add_argument("--million-workers", type=int, default=2)
    parser.add_argument("--million-seconds", type=float, default=60.0)
    parser.add_argument("--lag-rate", type=float, default=500.0)
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    parser.add_argument("--rate-requests", type=int, default=20_000)
    parser.add_argument("--client-cpu", type=int, default=0)
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument(
        "--skip", default="", help="cases to leave out: conversation,sessions,million,lag,rate,shared"
    )
    parser.add_argument("--work", type=Path, help="keep generated traces here (default: a temporary folder)")
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        args.client_cpu = args.server_cpu = None
    skip = set(filter(None, args.skip.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name, case in (("rate", rate_case), ("shared", shared_case), ("lag", lag_case),
                           ("conversation", conversation_case), ("sessions", sessions_case),
                           ("million", million_case)):  # fmt: skip
            if name not in skip:
                case(args, work)


if __name__ == "__main__":
    main()
