"""`replayproxy demo` / `make demo`: the whole product loop on one machine, in under three minutes.

A simulated engine plays production with the proxy in front of it; the replayer itself drives a
synthetic workload (shared system prompts, multi-turn sessions, bursts) through the proxy; the
recorded trace is inspected, replayed against two candidate engine configurations, and compared
with the production baseline. Every stage is the real CLI in a subprocess, on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from replayproxy import children
from replayproxy.errors import RunAborted
from replayproxy.launch import run_server

SLO = "ttft<=300ms,tpot<=60ms"
REPORT_NAME = "report.html"
STAGE_GRACE_S = 30.0  # an interrupted stage (a replay) writes what it has before SIGKILL
SERVER_NICENESS = 5  # the simulated engines and the proxy yield the CPU to the replayer's send loop
# Candidate engines: same simulated model, prefix cache on (as production) vs off.
CANDIDATES = {"prefix-cache-on": [], "prefix-cache-off": ["--no-prefix-cache"]}
REQUESTS, RATE = 150, 10  # 15 s a stage: enough for a clear verdict, short enough to wait for
WORKLOAD = [
    "--requests", str(REQUESTS), "--rate", str(RATE), "--arrival", "gamma:2.0",
    "--input-len", "lognormal:mean=900,sigma=0.6", "--output-len", "lognormal:mean=60,sigma=0.5",
    "--prefix-groups", "4", "--prefix-len", "512", "--sessions-share", "0.3",
    "--model", "sim-llama-3.1-8b", "--seed", "7",
]  # fmt: skip


EXAMPLES = (
    "replayproxy demo",
    "replayproxy demo --keep demo-output --progress log",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the trace, results and report in DIR (default: a temporary directory, report only)",
    )
    parser.add_argument(
        "--progress",
        choices=("auto", "tty", "log", "none"),
        default="auto",
        help="each replay's live progress: panel (tty), a line every 10 s (log), none",
    )


def run(args: argparse.Namespace) -> int:
    keep = Path(args.keep) if args.keep else None
    work = keep or Path(tempfile.mkdtemp(prefix="replayproxy-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    _clear_previous_run(work)
    try:
        with children.signals_interrupt():  # SIGTERM/SIGHUP stop the servers and stages as Ctrl-C does
            return _demo(work, args.progress)
    finally:
        if keep is None:
            _remove_all_but_the_report(work)


def _artefacts() -> list[str]:
    candidates = [f"{label}.rpr" for label in CANDIDATES]
    return ["workload.rpt", "traces", "live-clients.rpr", *candidates, REPORT_NAME]


def _clear_previous_run(work: Path) -> None:
    """An earlier demo's files in a kept directory would be replayed again (its traces add up)."""
    for name in _artefacts():
        path = work / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _remove_all_but_the_report(work: Path) -> None:
    """Without --keep, only the HTML report (whose path was printed) outlives the demo."""
    for path in work.iterdir():
        if path.name != REPORT_NAME:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _demo(work: Path, progress: str = "none") -> int:
    workload, traces, html = work / "workload.rpt", work / "traces", work / REPORT_NAME
    _stage("writing a synthetic production workload (shared system prompts, sessions, bursts)")
    _cli("synth", "-o", str(workload), *WORKLOAD)
    with _server("sim", "production engine (simulated)", "--port", "0", "--seed", "1") as production:
        with _server(
            "proxy",
            "sidecar proxy in front of it",
            "--upstream", production,
            "--listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0",
            "--trace-dir", str(traces),
        ) as proxy:  # fmt: skip
            _stage(f"driving live traffic through the proxy at {proxy} (about {REQUESTS // RATE} s)")
            # Plain clients: no calibration probes or cache resets, which production would not see.
            _cli("replay", str(workload), "--target", proxy, "--flavor", "vllm", *_progress(progress),
                 "--no-calibrate", "--no-reset-prefix-cache",
                 "--label", "live-clients", "-o", str(work / "live-clients.rpr"))  # fmt: skip
            _stage("stopping the proxy (it drains and closes the trace)")
    _stage("inspecting the recorded trace")
    _cli("inspect", str(traces), show=True)
    results = []
    for label, options in CANDIDATES.items():
        with _server("sim", f"candidate engine '{label}'", "--port", "0", "--seed", "1", *options) as target:
            _stage(f"replaying the recorded trace against '{label}' (about {REQUESTS // RATE} s)")
            result = work / f"{label}.rpr"
            _cli("replay", str(traces), "--target", target, "--flavor", "vllm", *_progress(progress),
                 "--label", label, "-o", str(result))  # fmt: skip
            results.append(str(result))
    _stage(f"comparing candidates against the production baseline (SLO {SLO})")
    plots = importlib.util.find_spec("matplotlib") is not None  # the [report] extra
    html_option = ["--html", str(html)] if plots else []
    _cli("report", *results, "--baseline", str(traces), "--slo", SLO, *html_option, show=True)
    if not plots:
        _stage("HTML report skipped: its plots need matplotlib (pip install 'replayproxy[report]')")
    elif html.exists():
        _stage(f"HTML report: {html}")
    else:
        _stage("HTML report was not written")
    return 0


def _progress(mode: str) -> list[str]:
    """The replay's own progress display goes straight to the demo's terminal (or log)."""
    if mode == "auto":
        mode = "tty" if sys.stderr.isatty() else "log"
    return ["--progress", mode]


def _stage(text: str) -> None:
    print(f"demo: {text}", flush=True)


def _cli(*argv: str, show: bool = False) -> None:
    """Run one replayproxy subcommand; its output is shown only when `show` or when it fails.

    A replay's stderr (its progress) always passes through, so a stage of half a minute is visibly alive.
    """
    live_stderr = show or argv[0] == "replay"
    with children.owned(
        [sys.executable, "-m", "replayproxy", *argv],
        STAGE_GRACE_S,
        stdout=None if show else subprocess.PIPE,
        stderr=None if live_stderr else subprocess.PIPE,
        text=True,
    ) as stage:
        out, err = stage.communicate()
    if stage.returncode != 0:
        if not show:
            sys.stderr.write((out or "") + (err or ""))
        raise RunAborted(f"'replayproxy {argv[0]}' failed with exit status {stage.returncode}")


@contextlib.contextmanager
def _server(command: str, what: str, *argv: str) -> Iterator[str]:
    """Start a server subcommand on loopback and always stop it (SIGTERM, so the proxy drains)."""
    _stage(f"starting the {what}")
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(
                run_server(["replayproxy", command, *_loopback(command, argv)], niceness=SERVER_NICENESS)
            )
        except RuntimeError as e:  # its output tail first, then the CLI's one error line
            sys.stderr.write(f"{e}\n")
            raise RunAborted(f"the {what} did not start") from e
        yield server.url


def _loopback(command: str, argv: Sequence[str]) -> list[str]:
    """Sims listen on loopback, with a context long enough for the workload's longest sessions."""
    return ["--host", "127.0.0.1", "--max-model-len", "32768", *argv] if command == "sim" else list(argv)
