"""What a flood of `/metrics` scrapes costs forwarding: request latency through the proxy with and
without 20 threads scraping its admin listener as fast as they can, side by side in one run.

Processes: a raw upstream answering `200 ok` at once, the proxy (recording on, pinned to CPU 0),
the flood (its own process: its threads must not share the probe's interpreter lock), and this
process, which sends one small POST at a time on a kept-alive connection and times each round
trip. Phases alternate (none, flood, none, flood, ...) so drift on a shared machine touches both.
The budget: forwarding p50 under the flood within 10 % of p50 without it.

    python benchmarks/admin_flood.py                 # 4 rounds of 2,000 requests per phase
    python benchmarks/admin_flood.py --quick         # 2 rounds of 500, a sanity check
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from replayproxy.clock import now_ns

THREADS = 20
BODY = b'{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
ANSWER = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}'  # noqa: E501


# --------------------------------------------------------------------------- upstream (its own process)


class _Upstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:  # requests carry Content-Length; this one knows the size
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                % (len(ANSWER), ANSWER)
            )


async def _serve_upstream(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port)
    print("upstream ready", flush=True)
    async with server:
        await server.serve_forever()


# --------------------------------------------------------------------------- flood (its own process)


def _flood(port: int, threads: int, seconds: float) -> None:
    """`threads` keep-alive scrapers of /metrics until `seconds` pass; prints scrapes answered."""
    done = [0] * threads
    deadline = now_ns() + int(seconds * 1e9)

    def scrape(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while now_ns() < deadline:
            try:
                conn.request("GET", "/metrics")
                conn.getresponse().read()
                done[i] += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.close()

    workers = [threading.Thread(target=scrape, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    print("flooding", flush=True)
    for w in workers:
        w.join()
    print(f"scrapes {sum(done)}", flush=True)


# --------------------------------------------------------------------------- this process: the probe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pin(pid: int, cpu: int) -> None:
    if (os.cpu_count() or 1) > 1:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, {cpu})


@contextlib.contextmanager
def _process(argv: list[str], cpu: int, ready: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    _pin(process.pid, cpu)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if ready in line:
                break
        else:
            raise RuntimeError(f"{argv[:4]} ended before '{ready}'")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _round_trips(port: int, n: int, gap_s: float) -> list[int]:
    """n POSTs one at a time on one kept-alive connection; each round trip in ns."""
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
    )
    times = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            sent = now_ns()
            sock.sendall(request)
            got = b""
            while not (b"\r\n\r\n" in got and got.endswith(ANSWER)):
                piece = sock.recv(65536)
                if not piece:
                    raise RuntimeError("the proxy closed the connection")
                got += piece
            times.append(now_ns() - sent)
            time.sleep(gap_s)
    return times


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 500 requests per phase")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=2000, help="per phase and round")
    parser.add_argument("--flood", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream:
        asyncio.run(_serve_upstream(args.upstream))
        return
    if args.flood:
        _flood(args.flood, THREADS, args.seconds)
        return
    rounds, n = (2, 500) if args.quick else (args.rounds, args.requests)
    gap_s = 0.001
    upstream, listen, admin = _free_port(), _free_port(), _free_port()
    me = [sys.executable, os.path.abspath(__file__)]
    _pin(os.getpid(), 1)
    with (
        tempfile.TemporaryDirectory() as traces,
        _process([*me, "--upstream", str(upstream)], 1, "upstream ready"),
        _process(
            [
                *(sys.executable, "-m", "replayproxy", "proxy", "--trace-dir", traces),
                *("--upstream", f"http://127.0.0.1:{upstream}", "--listen", f"127.0.0.1:{listen}"),
                *("--admin-listen", f"127.0.0.1:{admin}"),
            ],
            0,
            "admin listening",
        ),
    ):
        _round_trips(listen, 200, gap_s)  # warm-up
        phases: dict[str, list[int]] = {"none": [], "flood": []}
        scrapes = 0
        for _ in range(rounds):
            phases["none"] += _round_trips(listen, n, gap_s)
            seconds = n * (gap_s + 0.0015) + 2.0  # outlasts the phase; ended below at once
            with _process(
                [*me, "--flood", str(admin), "--seconds", f"{seconds:.1f}"], 1, "flooding"
            ) as flood:
                time.sleep(0.3)  # the threads are scraping
                phases["flood"] += _round_trips(listen, n, gap_s)
                out, _ = flood.communicate(timeout=seconds + 30)
                scrapes += int(out.split()[-1]) if out.strip() else 0
    none, flooded = phases["none"], phases["flood"]
    print(f"{'phase':<8}{'n':>7}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for name, values in phases.items():
        print(
            f"{name:<8}{len(values):>7}{_pct(values, 0.5):>9.3f}{_pct(values, 0.9):>9.3f}"
            f"{_pct(values, 0.99):>9.3f}{statistics.fmean(values) / 1e6:>9.3f}"
        )
    ratio = _pct(flooded, 0.5) / _pct(none, 0.5)
    verdict = "within" if ratio <= 1.10 else "OVER"
    print(
        f"forwarding p50 under a {THREADS}-thread /metrics flood: {ratio:.3f}x no flood "
        f"({verdict} the 1.10x budget)"
    )
    print(f"scrapes answered during the flood phases: {scrapes}")


if __name__ == "__main__":
    main()
