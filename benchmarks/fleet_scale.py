"""A fleet's traces in object storage, measured against moto's S3 server on 127.0.0.1.

    .venv/bin/python benchmarks/fleet_scale.py [--requests 1000000] [--segments 60] [--shards 4]

In one run: (1) upload throughput of the sidecar's uploader (proxy.recording.upload) for the segments;
(2) loading the trace from the bucket (prefix of all segments) against loading the same files
from local disk — seconds to a loaded trace and peak RSS of each, in a fresh process;
(3) forwarding latency p50/p99 through a recording proxy in front of a fast upstream (the
streaming upstream and open-loop load generator of proxy_overhead.py), without and with uploads
of rotated segments to the bucket going on meanwhile; (4) `replay` of the trace from the bucket
and from local disk (its first --replay-limit requests, against the sim): time from launching the
command to its first request, and the peak RSS of its largest process (sender or preparer);
(5) a --shards-shard session-affine closed-loop replay, one process per shard on one --start-at,
of a multi-turn trace recorded through three proxies behind a round-robin router (so its reply
links are real, and cross pods): overlapping turns, reply links whose two ends different shards
sent (both must be 0), and each shard's schedule lag p99 and clock offset, as `report` gives them.
The local S3 server is a Python process on the same cores: throughput here is a floor, not what a
real store gives; the ratio remote/local of time to a loaded trace is the figure to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import resource
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import proxy_overhead as po  # the sibling benchmark's upstream, proxy command line and load generator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from replayproxy import children  # noqa: E402
from replayproxy.clock import now_ns, wall_ns  # noqa: E402
from replayproxy.proxy.recording.upload import SegmentUploader  # noqa: E402
from replayproxy.results import load_results  # noqa: E402
from replayproxy.synthetic import LengthDist, SynthSpec, generate, header_for  # noqa: E402
from replayproxy.trace import load, write_trace  # noqa: E402
from tests import conversations, servers  # noqa: E402 — the router test's conversations and servers

_LOAD = """
import sys, time
from replayproxy.trace import load
t = time.perf_counter()
cols = load(sys.argv[1:])
seconds = time.perf_counter() - t
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(len(cols), seconds, int(status["VmHWM"].split()[0]) / 1024)
"""


@contextlib.contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with children.owned(argv, 0.0, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        for _ in range(600):
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                break
            time.sleep(0.1)
        env = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL_S3": endpoint,
        }
        os.environ.update(env)
        yield env


def segments(directory: Path, requests: int, count: int) -> list[Path]:
    spec = SynthSpec(
        requests=requests,
        rate_rps=300.0,
        prefix_groups=8,
        prefix_len_tokens=512,
        sessions_share=0.6,
        think_s=5.0,
        input_len=LengthDist.parse("lognormal:mean=1500,sigma=0.8"),
        seed=1,
    )
    shapes = generate(spec)
    per = -(-requests // count)
    paths = []
    for i in range(count):
        path = directory / f"trace-20261207T{13 + i // 60:02d}{i % 60:02d}00Z-{i:04d}.rpt"
        write_trace(path, header_for(spec), itertools.islice(shapes, per), mono_ns=now_ns, wall_ns=wall_ns)
        paths.append(path)
    return paths


def timed_load(env: dict[str, str], *names: str) -> tuple[int, float, float]:
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, *names],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    n, seconds, rss = done.stdout.split()
    return int(n), float(seconds), float(rss)


def forwarding(
    work: Path, segments: list[Path], copies: int, rate: float, duration_s: float
) -> dict[str, dict[str, float]]:
    """E2E and TTFT p50/p99 (ms) through a recording proxy, without and with uploads going on: the
    second proxy starts with `copies` copies of the segments in its trace directory (closed files
    left by an earlier run, which it uploads at once) and rotates every second. Returns the figures
    and how many files were still waiting when the load ended (>0: uploads ran throughout)."""
    upstream = po._free_port()
    up = [sys.executable, po.__file__, "--role", "upstream", "--port", str(upstream), "--gap-ms", "1"]
    out: dict[str, dict[str, float]] = {}
    with po._process(up, 1, "upstream ready"):
        for name, upload in (("without upload", False), ("with upload", True)):
            here = work / name.replace(" ", "-")
            (here / "traces").mkdir(parents=True)
            argv = po.proxy_argv("replayproxy+rec", po._free_port(), upstream, here)
            if upload:
                for i, f in enumerate(segments * copies):
                    (here / "traces" / f"trace-20261207T120000Z-{i:05d}.rpt").write_bytes(f.read_bytes())
                argv += ["--upload-url", "s3://fleet/forwarding", "--pod-name", "bench", "--rotate-s", "1"]
            port = int(argv[argv.index("--listen") + 1].rsplit(":", 1)[1])
            with po._process(argv, 0, "proxy listening on"):
                result = po._run_load(port, rate, duration_s, 1)
                left = len(list((here / "traces").glob("trace-20261207T120000Z-*.rpt")))
            e2e, ttft = result["e2e_ns"], result["ttft_ns"]
            out[name] = {
                "e2e_p50": po._pct(e2e, 0.5), "e2e_p99": po._pct(e2e, 0.99),
                "ttft_p50": po._pct(ttft, 0.5), "ttft_p99": po._pct(ttft, 0.99),
                "ok": result["ok"], "sent": result["sent"], "waiting": left,
            }  # fmt: skip
    return out


def replay_start(env: dict[str, str], trace: str, target: str, out: Path, limit: int) -> tuple[float, float]:
    """`replay` of the trace's first `limit` requests: seconds from launching the command to its
    first request, and the peak RSS (MB) of its largest process (sender or preparer), as GNU time
    reports it: ru_maxrss of a process started from a small one (started from this process, it
    would start at this process's size)."""
    argv = ["/usr/bin/time", "-f", "maxrss_kb %M", sys.executable, "-m", "replayproxy", "replay", trace,
            "--target", target, "-o", str(out), "--flavor", "vllm", "--limit", str(limit),
            "--quiet"]  # fmt: skip
    launched = wall_ns()
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"replay of {trace} failed: {done.stderr[-2000:]}")
    maxrss_kb = int(done.stderr.rsplit("maxrss_kb ", 1)[1].split()[0])
    (result,) = load_results([out])
    first = min(t for t in result.column("sent_ns").tolist() if t >= 0)
    return (result.header.start_wall_ns + first - launched) / 1e9, maxrss_kb / 1024


def recorded_sessions(work: Path, conversations_n: int, turns: int) -> Path:
    """A multi-turn trace with real reply links: conversations whose replies are sent back (echo)
    through three recording proxies behind a round-robin router, joined into one file."""
    work.mkdir(parents=True)
    key = work / "hash.key"
    key.write_text(secrets.token_hex(32))
    key.chmod(0o600)
    dirs = [work / f"pod{i}" for i in range(3)]
    with servers.sim("--speed", "20") as engine:
        proxies = [servers.start_proxy(engine.url, d, "--hash-key-file", str(key)) for d in dirs]
        with proxies[0] as a, proxies[1] as b, proxies[2] as c:
            urls = [a.url, b.url, c.url]
            asyncio.run(conversations.send(urls, "sim-llama-3.1-8b", conversations_n, turns, echo=True))
    return work


def sharded_replay(env: dict[str, str], traces: str, shards: int, work: Path) -> dict[str, object]:
    """`--shards` processes replaying `traces` closed loop on one --start-at against the sim, results
    to the bucket; what `report` says of them, and the reply links whose ends two shards sent."""
    cols = load([traces])
    with servers.sim("--speed", "20") as sim:
        start = f"{wall_ns() / 1e9 + 20:.3f}"
        pods = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "replayproxy",
                    "replay",
                    traces,
                    "--target",
                    sim.url,
                    "--flavor",
                    "vllm",
                    "--sessions",
                    "closed",
                    "--shard",
                    f"{i}/{shards}",
                    "--start-at",
                    start,
                    "--quiet",
                    "-o",
                    f"s3://fleet/replays/sharded/shard-{i}.rpr",
                ],
                env={**os.environ, **env},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )  # fmt: skip
            for i in range(shards)
        ]
        codes = [pod.wait(300) for pod in pods]
    if any(codes):
        raise RuntimeError(f"a shard failed: {[p.stderr.read().decode()[-500:] for p in pods if p.stderr]}")
    results = load_results(["s3://fleet/replays/sharded/"])
    owner = {i: int(r.header.shard.split("/")[0]) for r in results for i in r.column("index").tolist()}
    by_chat = {int(c): owner[i] for i, c in enumerate(cols.chat_id.tolist()) if c and i in owner}
    links = [
        (by_chat[int(p)], owner[i]) for i, p in enumerate(cols.parent_id.tolist()) if p and int(p) in by_chat
    ]
    reported = subprocess.run(
        [sys.executable, "-m", "replayproxy", "report", "s3://fleet/replays/sharded/", "--json"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    (run,) = json.loads(reported.stdout)["runs"]
    return {
        "requests": len(owner),
        "of": len(cols),
        "sessions": len({int(s) for s in cols.session.tolist() if s}),
        "links": len(links),
        "links_lost": sum(1 for parent, child in links if parent != child),
        "overlapping": (run["sessions"] or {}).get("overlapping_turns"),
        "shards": run["shard_clocks"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=60_000, help="requests of the segmented trace")
    parser.add_argument("--segments", type=int, default=60)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100.0, help="forwarding load, streaming req/s")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds of forwarding load per case")
    parser.add_argument("--replay-limit", type=int, default=200, help="requests replayed to time the start")
    parser.add_argument("--conversations", type=int, default=24, help="of the sharded replay's trace")
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, s3_server() as env:
        import boto3

        boto3.client("s3").create_bucket(Bucket="fleet")
        directory = Path(tmp) / "local"
        directory.mkdir()
        files = segments(directory, args.requests, args.segments)
        size = sum(f.stat().st_size for f in files)
        n_local, local_s, local_rss = timed_load(env, str(directory))

        spool = Path(tmp) / "spool"
        spool.mkdir()
        for f in files:
            (spool / f.name).write_bytes(f.read_bytes())
        uploader = SegmentUploader("s3://fleet/traces", "bench-0", retry_s=0.1)
        started = time.perf_counter()
        uploader.start()
        uploader.offer(sorted(spool.iterdir()))
        while uploader.waiting:
            time.sleep(0.01)
        upload_s = time.perf_counter() - started
        uploaded, failed, _, _ = uploader.take_counts()
        uploader.close(1.0)

        n_remote, remote_s, remote_rss = timed_load(env, "s3://fleet/traces/")
        assert n_remote == n_local == args.requests, (n_remote, n_local)

        copies = max(1, math.ceil(1.5 * args.duration * (size / upload_s) / size))  # uploads outlast the load
        forwarded = forwarding(Path(tmp) / "forwarding", files, copies, args.rate, args.duration)

        with servers.sim("--speed", "50") as sim:
            out = Path(tmp) / "start"
            out.mkdir()
            local_first = replay_start(env, str(directory), sim.url, out / "local.rpr", args.replay_limit)
            remote_first = replay_start(env, "s3://fleet/traces/", sim.url, out / "s3.rpr", args.replay_limit)

        recorded = recorded_sessions(Path(tmp) / "sessions", args.conversations, args.turns)
        for f in sorted(recorded.glob("pod*/*.rpt")):
            boto3.client("s3").upload_file(
                str(f), "fleet", f"sessions/date=2026-12-07/hour=13/{f.parent.name}/{f.name}"
            )
        sharded = sharded_replay(env, "s3://fleet/sessions/", args.shards, Path(tmp))

    mb = size / 1e6
    print(f"trace: {args.requests} requests in {args.segments} segments, {mb:.1f} MB")
    rate = f"{mb / upload_s:.1f} MB/s"
    print(
        f"upload: {uploaded} files ({failed} failed attempts) in {upload_s:.2f} s = {rate}, "
        f"{args.segments / upload_s:.1f} files/s"
    )
    print(f"load local : {local_s:.2f} s to a loaded trace, peak RSS {local_rss:.0f} MB")
    print(
        f"load s3    : {remote_s:.2f} s to a loaded trace, peak RSS {remote_rss:.0f} MB "
        f"(x{remote_s / local_s:.2f} time, x{remote_rss / local_rss:.2f} memory)"
    )
    print(f"forwarding, {args.rate:g} streaming req/s x {args.duration:g} s through a recording proxy:")
    for name, f in forwarded.items():
        print(
            f"  {name:15s}: E2E p50 {f['e2e_p50']:.2f} ms p99 {f['e2e_p99']:.2f} ms, "
            f"TTFT p50 {f['ttft_p50']:.2f} ms p99 {f['ttft_p99']:.2f} ms, {f['ok']:.0f}/{f['sent']:.0f} ok"
            + (
                f", {f['waiting']:.0f} of {args.segments * copies} old segments still waiting at the end"
                if "with" in name
                else ""
            )
        )
    for name, (first_s, rss) in (("local", local_first), ("s3", remote_first)):
        print(
            f"replay {name:5s}: first request {first_s:.2f} s after launch, peak RSS {rss:.0f} MB "
            f"(largest process; {args.requests} requests loaded, first {args.replay_limit} sent)"
        )
    print(
        f"sharded closed-loop replay: {args.shards} shards, {sharded['requests']} of {sharded['of']} "
        f"requests sent once each, {sharded['sessions']} sessions, "
        f"overlapping turns {sharded['overlapping']}, "
        f"reply links {sharded['links']}, crossing shards {sharded['links_lost']}"
    )
    for c in sharded["shards"]:  # type: ignore[attr-defined]
        offset = (
            "-"
            if c["clock_offset_ms"] is None
            else f"{c['clock_offset_ms']:.1f} ± {c['clock_offset_bound_ms']:.1f} ms"
        )
        print(f"  shard {c['shard']}: lag p99 {c['lag_p99_ms']:.2f} ms, clock offset vs target {offset}")
    print(f"peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
