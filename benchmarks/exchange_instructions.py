"""Instructions per phase of one streamed exchange on the forwarding path, without sockets.

The exchange state machine is sans-I/O, so its Python work can be counted apart from the kernel,
uvloop and the machine's noise: this script drives a `ClientSide` and its `Exchange` over scripted
links (no socket, no loop, no recorder process) and counts, under `valgrind --tool=callgrind`, only
the instructions of one phase, run for N exchanges through `filter()` (callgrind's
`--toggle-collect=filter_next`). The phases on the TTFT path are the request (head and body in one
read) and the response head with the first chunk in one read; then 31 chunks one per read (the
paced shape of overhead_budget.py), the same 31 in one read (the burst shape), and the end.
Counts repeat to within a percent whatever else runs, so they tell small changes apart where
proxy_overhead.py's wall-clock figures on a shared machine cannot.

`--handoff` counts, per capture of the same recorded exchanges, recording's work after the
exchange ends, by the process it runs in: packing captures for the pipe to the recorder process
(the forwarding process's share), and in the recorder process unpacking them, then building the
shapes and writing them to a trace (which a recorder thread did inside the forwarding process).

    python benchmarks/exchange_instructions.py                 # off, recording, recording without injection
    python benchmarks/exchange_instructions.py --modes rec --phases request,head
    python benchmarks/exchange_instructions.py --handoff       # recording's work per capture, by process
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from replayproxy.proxy.client import ClientSide
from replayproxy.proxy.forward import Forwarder
from replayproxy.proxy.metrics import HotCounters
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.seam import Borrower
from replayproxy.proxy.settings import ProxySettings

MODES = {"off": "recording off", "rec": "recording (defaults)", "noinject": "recording, no usage injection"}
PHASES = ("request", "head", "paced", "burst", "end")
_BODY = json.dumps(
    {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "Go. " * 40}]}
).encode()
_REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
_REQUEST += b"Content-Length: %d\r\n\r\n%b" % (len(_BODY), _BODY)
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_USAGE = b'data: {"id":"b","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":32}}\n\n'
_COUNT = re.compile(rb"^(?:summary|totals): (\d+)", re.M)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


_CHUNKS = [
    _chunk(b'data: {"id":"b","choices":[{"index":0,"delta":{"content":" tok%d"}}]}\n\n' % i)
    for i in range(32)
]


class _Link:
    def __init__(self) -> None:
        self.sent = bytearray()

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        pass

    def pause(self, paused: bool) -> None:
        pass


class _Upstream(_Link):
    requests = 0
    borrower: Borrower | None = None


class _Pool:
    """Lends a fresh scripted connection at once."""

    def __init__(self) -> None:
        self.lent: _Upstream | None = None

    def acquire(self, borrower: Borrower) -> None:
        self.lent = _Upstream()
        self.lent.borrower = borrower
        borrower.upstream_ready(self.lent)

    def release(self, conn: Any, reusable: bool, tick: int) -> None:
        pass

    def forget(self, borrower: Borrower) -> None:
        pass


class _Keep:
    """An observer that wants every exchange and keeps its capture."""

    def __init__(self) -> None:
        self.captures: list[Capture] = []

    def wants(self, endpoint: str) -> bool:
        return True

    def finished(self, capture: Capture) -> None:
        self.captures.append(capture)


class _Exchange:
    """One client connection, its pool and the phases to play on it."""

    def __init__(self, mode: str) -> None:
        settings = ProxySettings(
            upstream="http://engine:8000",
            listen="127.0.0.1:0",
            admin_listen="",
            record=False,
            inject_usage=mode == "rec",
        )
        self.observer = _Keep()
        forwarder = Forwarder(settings, HotCounters(), self.observer if mode != "off" else None)
        self.pool = _Pool()
        forwarder.pool = self.pool  # type: ignore[assignment]
        self.client = _Link()
        self.side = ClientSide(forwarder, self.client)

    def answer(self, *reads: bytes) -> None:
        assert self.pool.lent is not None and self.pool.lent.borrower is not None
        for data in reads:
            self.pool.lent.borrower.upstream_data(data)

    def request(self) -> bool:
        self.side.feed(_REQUEST)
        return False

    def head(self) -> bool:
        self.answer(_HEAD + _CHUNKS[0])
        return False

    def paced(self) -> bool:
        self.answer(*_CHUNKS[1:])
        return False

    def burst(self) -> bool:
        self.answer(b"".join(_CHUNKS[1:]))
        return False

    def end(self) -> bool:
        assert self.pool.lent is not None
        tail = (_USAGE if b"include_usage" in self.pool.lent.sent else b"") + b"data: [DONE]\n\n"
        self.answer(_chunk(tail) + b"0\r\n\r\n")
        return False


def _play(mode: str, phase: str, count: int) -> None:
    """Run every phase of `count` exchanges; only `phase` goes through filter() (counted)."""
    exchanges = [_Exchange(mode) for _ in range(count)]
    gc.disable()
    for step in ("request", "head", "burst" if phase == "burst" else "paced", "end"):
        if step == phase:
            list(filter(lambda ex: getattr(ex, step)(), exchanges))  # noqa: B023 — used at once
        else:
            for ex in exchanges:
                getattr(ex, step)()
    if not all(ex.client.sent.endswith(b"0\r\n\r\n") for ex in exchanges):
        sys.exit("exchange_instructions: a stream did not end")


HANDOFF = {
    "pack": "forwarding process: pack for the pipe",
    "unpack": "recorder process: unpack",
    "record": "recorder process: shape + write",
}


def _handoff(step: str, count: int) -> None:
    """Record `count` exchanges, then run one step of recording's work on their captures through
    filter() (counted); the steps before it run uncounted, as they would have."""
    from replayproxy.clock import Anchor
    from replayproxy.proxy.prompt import PromptHasher
    from replayproxy.proxy.recording import wire
    from replayproxy.proxy.recording.core import TraceRecorder
    from replayproxy.proxy.recording.tally import Tally

    exchanges = [_Exchange("rec") for _ in range(count)]
    for name in ("request", "head", "paced", "end"):
        for ex in exchanges:
            getattr(ex, name)()
    captures = [c for ex in exchanges for c in ex.observer.captures]
    gc.disable()
    packer = wire.packer()
    batches = [captures[i : i + 4] for i in range(0, len(captures), 4)]  # 200 req/s, a batch per 20 ms
    pack = lambda batch: packer.pack([wire.CAPTURES, list(map(wire.capture_record, batch))])  # noqa: E731
    if step == "pack":
        list(filter(lambda batch: not pack(batch), batches))
        return
    packed = [pack(batch) for batch in batches]
    reader = wire.unpacker()
    unpacked: list[list[Capture]] = []

    def unpack(data: bytes) -> bool:
        reader.feed(data)
        unpacked.extend([list(map(wire.capture_from, payload)) for _, payload in reader])
        return False

    if step == "unpack":
        list(filter(unpack, packed))
    else:
        list(map(unpack, packed))
    if step == "record":
        with tempfile.TemporaryDirectory() as tmp:
            settings = ProxySettings(upstream="http://engine:8000", trace_dir=Path(tmp))
            recorder = TraceRecorder(settings, PromptHasher(b"k" * 32), Anchor.take(), Tally())
            list(filter(lambda batch: recorder.record(batch), unpacked))  # type: ignore[func-returns-value]
            recorder.close()
            if recorder.tally.written != len(captures):
                sys.exit(f"exchange_instructions: {recorder.tally.written} of {len(captures)} written")


def _count(mode: str, phase: str, count: int, work: Path) -> float:
    out = work / f"{mode}-{phase}.out"
    play = ["--play-handoff", phase] if mode == "handoff" else ["--play", mode, phase]
    argv = ["valgrind", "--tool=callgrind", "--toggle-collect=filter_next", f"--callgrind-out-file={out}",
            sys.executable, __file__, *play, "--count", str(count)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"exchange_instructions: {mode} {phase} failed:\n{done.stderr[-2000:]}")
    found = _COUNT.search(out.read_bytes())
    return int(found.group(1)) / count if found else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated: " + ", ".join(PHASES))
    parser.add_argument("--count", type=int, default=300, help="exchanges per count")
    parser.add_argument("--handoff", action="store_true", help="recording's work per capture, by process")
    parser.add_argument("--play", nargs=2, metavar=("MODE", "PHASE"), help=argparse.SUPPRESS)
    parser.add_argument("--play-handoff", metavar="STEP", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.play:
        _play(args.play[0], args.play[1], args.count)
        return
    if args.play_handoff:
        _handoff(args.play_handoff, args.count)
        return
    modes, phases = args.modes.split(","), args.phases.split(",")
    unknown = [m for m in modes if m not in MODES] + [p for p in phases if p not in PHASES]
    if unknown:
        sys.exit(f"exchange_instructions: unknown mode or phase {unknown[0]!r}")
    if shutil.which("valgrind") is None:
        sys.exit("exchange_instructions: valgrind is not installed")
    if args.handoff:
        print(f"recording's work per capture after the exchange ({args.count} recorded 32-chunk streams)")
        with tempfile.TemporaryDirectory() as tmp:
            for step, label in HANDOFF.items():
                print(f"  {label:42}{_count('handoff', step, args.count, Path(tmp)) / 1e3:>9,.1f}k")
        return
    print(f"instructions per exchange ({args.count} exchanges per count; paced and burst: 31 chunks)")
    print(f"  {'':32}" + "".join(f"{p:>10}" for p in phases))
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            cells = "".join(f"{_count(mode, p, args.count, Path(tmp)) / 1e3:>9,.1f}k" for p in phases)
            print(f"  {MODES[mode]:32}{cells}")


if __name__ == "__main__":
    main()
