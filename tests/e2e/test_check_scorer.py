"""`check --score CMD` with hostile scorers: bounded in time and memory, and nothing it started survives.

Each scorer writes the pids it starts into a file, so the test can look for them (and for their
process groups, and their children) after the command ended; the command runs as a real process,
its peak memory read from `wait4`.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from replayproxy.results import load_checks
from tests.processes import finish, recorded_pids, start_cli, survivors
from tests.servers import sim

pytestmark = pytest.mark.slow

PROMPTS = b'{"messages": [{"role": "user", "content": "hello"}]}\n{"prompt": "Once upon a time"}\n'
TIMEOUT_S = 10
MAX_RSS_MB = 200


def _check(url: str, tmp_path: Path, scorer: str, *extra: str) -> list[str]:
    (tmp_path / "prompts.jsonl").write_bytes(PROMPTS)
    return [
        "check", "--target", f"a={url}", "--prompts", str(tmp_path / "prompts.jsonl"), "-o",
        str(tmp_path / "c.rpc"), "--repeat", "2", "--max-tokens", "8", "--timeout", str(TIMEOUT_S),
        "--score", scorer, *extra,
    ]  # fmt: skip


def _recording(tmp_path: Path, body: str) -> str:
    """A scorer that writes its own pid and its background child's into pids.txt."""
    pids = tmp_path / "pids.txt"
    return f"sh -c 'echo $$ >> {pids}; {body} & echo $! >> {pids}; {{tail}}'"


@pytest.mark.parametrize(
    ("scorer", "failure"),
    [
        ("yes", "the scorer failed on 4 of 4 answers; first: printed more than 4096 bytes"),
        ("{recording}", ""),
    ],
    ids=["yes", "grandchild"],
)
def test_a_hostile_scorer_is_bounded_and_leaves_nothing(tmp_path: Path, scorer: str, failure: str) -> None:
    scorer = scorer.replace("{recording}", _recording(tmp_path, "sleep 40").replace("{tail}", "echo 1"))
    with sim("--speed", "20") as engine:
        started = time.perf_counter()
        process = start_cli(*_check(engine.url, tmp_path, scorer), out_dir=tmp_path)
        done = finish(process, tmp_path)
        took = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    assert took < TIMEOUT_S + 5 and done.max_rss_mb < MAX_RSS_MB, (took, done.max_rss_mb)
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr
    (loaded,) = load_checks([tmp_path / "c.rpc"])
    if failure:
        assert failure in done.stderr
        assert set(loaded.column("score")) == {""}
    else:
        assert set(loaded.column("score")) == {"1"}  # answered at once: the sleep held nothing up
        pids = recorded_pids(tmp_path / "pids.txt")
        assert len(pids) == 8
        assert survivors(pids, parents=[process.pid]) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_check_kills_every_scorer_group(tmp_path: Path, sig: signal.Signals) -> None:
    scorer = _recording(tmp_path, "sleep 60").replace("{tail}", "wait")
    pids_file = tmp_path / "pids.txt"
    with sim("--speed", "20") as engine:
        process = start_cli(*_check(engine.url, tmp_path, scorer, "--timeout", "60"), out_dir=tmp_path)
        deadline = time.perf_counter() + 60
        while len(recorded_pids(pids_file)) < 8 and time.perf_counter() < deadline:  # 4 scorers at once
            time.sleep(0.1)
        pids = recorded_pids(pids_file)
        assert len(pids) == 8, (tmp_path / "stderr.txt").read_text()
        sent = time.perf_counter()
        process.send_signal(sig)
        done = finish(process, tmp_path)
        took = time.perf_counter() - sent
    assert done.returncode == 130, done.stderr
    assert took < 5, took
    assert done.stderr.strip().endswith("replayproxy check: interrupted")
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr
    assert survivors(pids, parents=[process.pid]) == []
    # Every answer came back before the scorers ran: they are kept, unscored, in a file marked interrupted.
    (loaded,) = load_checks([tmp_path / "c.rpc"])
    assert loaded.footer.get("interrupted") is True and set(loaded.column("score")) == {""}
