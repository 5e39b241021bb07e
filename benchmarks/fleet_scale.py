"""A fleet's traces in object storage, measured against moto's S3 server on 127.0.0.1.

    .venv/bin/python benchmarks/fleet_scale.py [--requests 1000000] [--segments 60] [--shards 4]

In one run: (1) upload throughput of the sidecar's uploader (proxy.upload) for the segments;
(2) loading the trace from the bucket (prefix of all segments) against loading the same files
from local disk — seconds to a loaded trace (what precedes a replay's first request) and peak RSS
of each, in a fresh process; (3) a session-affine split into --shards shards: requests overlapping
between shards, sessions split, reply links crossing shards (all must be 0), and each shard's share.
The local S3 server is a Python process on the same cores: throughput here is a floor, not what a
real store gives; the ratio remote/local of time to a loaded trace is the figure to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from replayproxy import children
from replayproxy.clock import now_ns, wall_ns
from replayproxy.proxy.upload import SegmentUploader
from replayproxy.replay.shards import shard_of
from replayproxy.synthetic import LengthDist, SynthSpec, generate, header_for
from replayproxy.trace import load, write_trace

_LOAD = """
import resource, sys, time
from replayproxy.trace import load
t = time.perf_counter()
cols = load(sys.argv[1:])
print(len(cols), time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=60_000)
    parser.add_argument("--segments", type=int, default=60)
    parser.add_argument("--shards", type=int, default=4)
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

        cols = load(files)
        rows = np.arange(len(cols), dtype=np.int64)
        shard = shard_of(cols, rows, args.shards)
        linked = cols.session != 0
        split_sessions = 0
        for session in np.unique(cols.session[linked]):
            split_sessions += len(np.unique(shard[cols.session == session])) > 1
        by_chat = {int(c): int(s) for c, s in zip(cols.chat_id, shard, strict=True) if c}
        crossing = sum(
            1 for p, s in zip(cols.parent_id, shard, strict=True) if p and by_chat.get(int(p), s) != s
        )
        shares = np.bincount(shard, minlength=args.shards)

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
    print(
        f"shards: {args.shards}, requests per shard {shares.tolist()}, overlapping 0 (a partition), "
        f"sessions split {split_sessions}, reply links crossing shards {crossing}"
    )
    print(f"peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
