"""Live progress of a run, as guidellm users know it: a rich panel on a terminal, or without one
(a pipe, a Kubernetes Job log) one plain line every `LOG_EVERY_S` seconds.

The runner's counters are read once a second off the send path (`Reading`); `Tracker` turns the
readings into running figures — elapsed and ETA against the trace's known duration, achieved vs
offered req/s, TTFT p50 / p95 and schedule lag p99 — and hands them to a `Display`.
"""

from __future__ import annotations

import bisect
import contextlib
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Literal, NamedTuple, Protocol, get_args

import numpy as np
from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from replayproxy import clock
from replayproxy.errors import BadOption

ProgressMode = Literal["auto", "tty", "log", "none"]
MODES: tuple[ProgressMode, ...] = get_args(ProgressMode)
Shown = Literal["tty", "log", "none"]  # a mode resolved for this run's stream
LOG_EVERY_S = 10.0
TTFT_WINDOW = 2000  # running TTFT percentiles over the most recent successful requests


def resolve(mode: str, quiet: bool, stream: IO[str]) -> Shown:
    """`auto` is a live panel on a terminal and log lines elsewhere; `--quiet` is `none`."""
    if mode not in MODES:
        raise BadOption(f"--progress: invalid choice: {mode!r} (choose from {', '.join(MODES)})")
    if quiet:
        return "none"
    if mode == "auto":
        return "tty" if stream.isatty() else "log"
    return mode


class Reading(NamedTuple):
    """What one sender did since its previous reading (counts are totals, lists are new values)."""

    total: int
    sent: int
    done: int
    errors: int
    lags_ns: list[int]
    ttfts_ns: list[int]


@dataclass(frozen=True, slots=True)
class Snapshot:
    elapsed_s: float
    duration_s: float  # the replayed window's schedule, scaled by the speed
    total: int
    sent: int
    done: int
    errors: int
    offered_rps: float  # requests whose scheduled time has passed, per second
    achieved_rps: float  # requests finished, per second
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    lag_p99_ms: float | None

    @property
    def in_flight(self) -> int:
        return self.sent - self.done

    @property
    def eta_s(self) -> float:
        """Until the last scheduled send (the tail of in-flight answers comes on top)."""
        return max(0.0, self.duration_s - self.elapsed_s)


class Display(Protocol):
    def update(self, snapshot: Snapshot) -> None: ...
    def close(self, snapshot: Snapshot | None) -> None: ...


@dataclass(slots=True)
class Tracker:
    """Running figures of one run from its readings; `scheduled_ns` sorted, relative to the start.

    Without a display (`--progress none`) it does nothing.
    """

    display: Display | None
    scheduled_ns: Sequence[int]
    clock: Callable[[], int]
    start_ns: int = 0  # absolute monotonic start; set once the run has one
    last: Snapshot | None = None
    _ttfts: deque[int] = field(default_factory=lambda: deque(maxlen=TTFT_WINDOW))
    _lags: list[int] = field(default_factory=list)

    def update(self, reading: Reading, start_ns: int) -> None:
        if self.display is None:
            return
        self.start_ns = start_ns
        self._ttfts.extend(reading.ttfts_ns)
        self._lags.extend(reading.lags_ns)
        elapsed_ns = max(self.clock() - self.start_ns, 1)
        due = bisect.bisect_right(self.scheduled_ns, elapsed_ns)
        ttfts = np.fromiter(self._ttfts, np.int64, len(self._ttfts))
        lags, self._lags = self._lags, []
        self.last = Snapshot(
            elapsed_s=elapsed_ns / 1e9,
            duration_s=(self.scheduled_ns[-1] if self.scheduled_ns else 0) / 1e9,
            total=reading.total,
            sent=reading.sent,
            done=reading.done,
            errors=reading.errors,
            offered_rps=due / (elapsed_ns / 1e9),
            achieved_rps=reading.done / (elapsed_ns / 1e9),
            ttft_p50_ms=_percentile_ms(ttfts, 50),
            ttft_p95_ms=_percentile_ms(ttfts, 95),
            lag_p99_ms=_percentile_ms(np.asarray(lags, np.int64), 99),
        )
        self.display.update(self.last)

    def close(self, final: Reading | None = None) -> None:
        """Show `final` (the whole run: its TTFTs replace the running window), then stop."""
        if final is not None and self.display is not None:
            self._ttfts.clear()
            self.update(final, self.start_ns)
        if self.display is not None:
            self.display.close(self.last)
            self.display = None


def merge(readings: Sequence[Reading]) -> Reading:
    """Several workers' latest readings as one (their new values are passed on once)."""
    return Reading(
        sum(r.total for r in readings),
        sum(r.sent for r in readings),
        sum(r.done for r in readings),
        sum(r.errors for r in readings),
        [lag for r in readings for lag in r.lags_ns],
        [ttft for r in readings for ttft in r.ttfts_ns],
    )


def _percentile_ms(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) / 1e6 if len(values) else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.2f} ms"


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


def line(s: Snapshot) -> str:
    """The plain progress line (log mode, and the panel's text)."""
    return (
        f"{_clock_text(s.elapsed_s)} elapsed, ETA {_clock_text(s.eta_s)}  "
        f"sent {s.sent}/{s.total}  done {s.done}  in flight {s.in_flight}  errors {s.errors}  "
        f"req/s {s.achieved_rps:.1f} of {s.offered_rps:.1f} offered  "
        f"TTFT p50 {_ms(s.ttft_p50_ms)} p95 {_ms(s.ttft_p95_ms)}  lag p99 {_ms(s.lag_p99_ms)}"
    )


@dataclass(slots=True)
class LogDisplay:
    """One line every `every_s` seconds (and a last one at the end), for logs without a terminal."""

    name: str
    stream: IO[str] = field(default_factory=lambda: sys.stderr)
    every_s: float = LOG_EVERY_S
    _printed_at: float = 0.0

    def update(self, snapshot: Snapshot) -> None:
        if snapshot.elapsed_s - self._printed_at >= self.every_s:
            self._printed_at = snapshot.elapsed_s
            print(f"{self.name}: {line(snapshot)}", file=self.stream, flush=True)

    def close(self, snapshot: Snapshot | None) -> None:
        if snapshot is not None and snapshot.elapsed_s != self._printed_at:
            print(f"{self.name}: {line(snapshot)}", file=self.stream, flush=True)


class RichDisplay:
    """A live panel redrawn in place (rich, as guidellm uses): a bar to the last send, then figures."""

    def __init__(self, name: str, stream: IO[str] | None = None) -> None:
        self._name = name
        self._console = Console(file=stream or sys.stderr)
        # Drawn only when a reading comes (once a second, between sends): no refresh thread of its
        # own competing with the send loop for the interpreter.
        self._live = Live(console=self._console, auto_refresh=False, transient=False)
        self._live.start()

    def _render(self, s: Snapshot) -> RenderableType:
        grid = Table.grid(padding=(0, 2))
        grid.add_row(
            f"[bold]{self._name}[/]",
            ProgressBar(total=max(s.total, 1), completed=s.done, width=30),
            f"{_clock_text(s.elapsed_s)} elapsed  ETA {_clock_text(s.eta_s)}",
        )
        grid.add_row(
            "",
            f"sent {s.sent}/{s.total}  done {s.done}  in flight {s.in_flight}  errors {s.errors}",
            f"req/s {s.achieved_rps:.1f} of {s.offered_rps:.1f} offered",
        )
        grid.add_row(
            "", f"TTFT p50 {_ms(s.ttft_p50_ms)}  p95 {_ms(s.ttft_p95_ms)}", f"lag p99 {_ms(s.lag_p99_ms)}"
        )
        return grid

    def update(self, snapshot: Snapshot) -> None:
        self._live.update(self._render(snapshot), refresh=True)

    def close(self, snapshot: Snapshot | None) -> None:
        if snapshot is not None:
            self._live.update(self._render(snapshot), refresh=True)
        self._live.stop()


def display_for(mode: Shown, name: str, stream: IO[str] | None = None) -> Display | None:
    """The display of a resolved mode (`tty`, `log`), or None for `none`."""
    if mode == "tty":
        return RichDisplay(name, stream)
    if mode == "log":
        return LogDisplay(name, stream or sys.stderr)
    return None


@contextlib.contextmanager
def stage(mode: Shown, name: str, text: str, every_s: float = LOG_EVERY_S) -> Iterator[None]:
    """A step of unknown length (reading a large public trace): a spinner on a terminal; in a log, a
    line every `every_s` while it lasts and one when it ends — nothing for a step shorter than that,
    so quick commands and their one-line errors stay as they are."""
    started = clock.now_ns()

    def elapsed() -> str:
        return _clock_text((clock.now_ns() - started) / 1e9)

    if mode == "tty":
        with Console(file=sys.stderr).status(f"{name}: {text}"):
            yield
        return
    if mode != "log":
        yield
        return
    done = threading.Event()
    ticked = threading.Event()

    def tick() -> None:
        while not done.wait(every_s):
            ticked.set()
            print(f"{name}: {text}: {elapsed()} so far", file=sys.stderr, flush=True)

    ticker = threading.Thread(target=tick, name="progress-ticker", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
    if ticked.is_set():
        print(f"{name}: {text}: done in {elapsed()}", file=sys.stderr, flush=True)
