"""`synth`, `inspect` and every command's one-line errors through the command line's main (in-process),
and in fresh interpreters (python -m replayproxy) where the process matters: byte-identical output
across processes (hash seeds differ), and `sim`, which replaces the process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from replayproxy import trace
from replayproxy.formats.profile_synth import SYNTH_HASH_SCHEME
from tests.cli import CliResult, run_cli

SYNTH = [
    "--requests", "300", "--rate", "20", "--arrival", "gamma:2", "--prefix-groups", "3", "--prefix-len", "64",
    "--sessions-share", "0.3", "--input-len", "lognormal:mean=300,sigma=0.5", "--seed", "9",
]  # fmt: skip


def fresh(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m replayproxy ARGS` in a new interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "replayproxy", *args], capture_output=True, text=True, timeout=60, check=False
    )


def assert_one_line_error(result: CliResult | subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("replayproxy") and "error:" in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_synth_is_byte_identical_for_a_seed_and_inspect_reads_it(tmp_path: Path) -> None:
    a, b = tmp_path / "a.rpt", tmp_path / "b.rpt"
    for path in (a, b):  # two interpreters, two hash seeds: the output must not depend on them
        result = fresh("synth", "-o", str(path), *SYNTH)
        assert result.returncode == 0 and result.stdout.strip() == f"wrote 300 requests to {path}"
    assert a.read_bytes() == b.read_bytes()
    text = run_cli("inspect", str(a))
    assert text.returncode == 0 and text.stderr == ""
    assert text.stdout.startswith("requests           300 in 1 file(s)") and "prefix reuse" in text.stdout
    copy = run_cli("inspect", "--json", str(a), str(b))  # a file given twice (a segment uploaded twice)
    assert (
        json.loads(copy.stdout)["requests"] == 300
        and f"{b}: the same records as {a}; read once" in copy.stderr
    )
    other = tmp_path / "c.rpt"
    assert fresh("synth", "-o", str(other), *SYNTH[:-1], "10").returncode == 0
    result = run_cli("inspect", "--json", str(a), str(other))
    profile = json.loads(result.stdout)
    assert profile["requests"] == 600 and profile["files"] == 2
    assert set(profile["input_tokens"]) == {"count", "p50", "p90", "p99", "max", "mean"}
    assert profile["prefix_reuse"] is None  # two seeds, two hash keys: not comparable
    assert profile["endpoints"] == {"chat": 600} and profile["peak_concurrency"] is None


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty file"),
        (b"\x00garbage\xff" * 50, "not a replayproxy file"),
        (b"col1,col2\n1,2\n", "bad magic"),
    ],
)
def test_inspect_refuses_files_that_are_not_traces(tmp_path: Path, content: bytes, needle: str) -> None:
    path = tmp_path / "bad.rpt"
    path.write_bytes(content)
    assert_one_line_error(run_cli("inspect", str(path)), "replayproxy inspect: error:", str(path), needle)
    assert_one_line_error(run_cli("inspect", "--json", str(path)), needle)


def test_inspect_of_a_missing_file(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("inspect", str(tmp_path / "nope.rpt")), "no such file", "nope.rpt")


def test_inspect_reports_what_a_damaged_trace_still_holds(tmp_path: Path) -> None:
    path = tmp_path / "t.rpt"
    assert run_cli("synth", "-o", str(path), *SYNTH).returncode == 0
    data = path.read_bytes()
    path.write_bytes(data[:-30])  # the footer frame is cut: every request is still there
    result = run_cli("inspect", "--json", str(path))
    assert result.returncode == 0 and json.loads(result.stdout)["requests"] == 300
    assert result.stderr.startswith("replayproxy inspect: warning:") and "truncated" in result.stderr
    header_end = 16 + int.from_bytes(data[8:12], "little")
    path.write_bytes(data[: header_end + 100])  # only the header survives
    result = run_cli("inspect", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert_one_line_error(result, "no request could be read", "truncated")


def test_synth_option_errors_are_one_line(tmp_path: Path) -> None:
    out = str(tmp_path / "x.rpt")
    assert_one_line_error(run_cli("synth", "-o", out, "--input-len", "zipf:2"), "unknown distribution 'zipf'")
    assert_one_line_error(run_cli("synth", "-o", out, "--arrival", "gamma:-2"), "gamma:CV")
    assert_one_line_error(run_cli("synth", "-o", out, "--sessions-share", "2"), "sessions-share")
    assert not Path(out).exists()


def test_synth_from_a_profile_scales_the_rate(tmp_path: Path) -> None:
    source, profile = tmp_path / "source.rpt", tmp_path / "profile.json"
    assert run_cli("synth", "-o", str(source), *SYNTH).returncode == 0
    assert run_cli("export", str(source), "--format", "profile", "-o", str(profile)).returncode == 0
    scaled = [tmp_path / "s1.rpt", tmp_path / "s2.rpt"]
    for path in scaled:
        result = run_cli(
            "synth", "-o", str(path), "--profile", str(profile), "--rate-scale", "2", "--seed", "4"
        )
        assert result.returncode == 0, result.stderr
    assert scaled[0].read_bytes() == scaled[1].read_bytes()
    header = trace.load(scaled[0]).headers[0]
    assert header.hash_scheme == SYNTH_HASH_SCHEME and header.extra["synth"]["rate_scale"] == 2.0
    before = json.loads(run_cli("inspect", "--json", str(source)).stdout)
    after = json.loads(run_cli("inspect", "--json", str(scaled[0])).stdout)
    assert after["requests"] == pytest.approx(2 * before["requests"], rel=0.2)
    assert after["duration_s"] == pytest.approx(before["duration_s"], rel=0.1)
    assert_one_line_error(
        run_cli("synth", "-o", str(tmp_path / "x.rpt"), "--profile", str(source)), "not a JSON profile"
    )


def test_bad_options_and_unknown_commands_are_one_line_errors() -> None:
    assert_one_line_error(
        run_cli("capacity", "--weight-dtype", "fp3"), "--weight-dtype", "invalid choice", "int4"
    )
    assert_one_line_error(run_cli("import"), "required")
    assert_one_line_error(run_cli("teleport"), "invalid choice", "replay")
    assert run_cli("capacity", "--weight-dtype", "fp3").returncode == 2


def _one_line_exit_2(argv: list[str]) -> str:
    done = fresh(*argv) if argv[0] == "sim" else run_cli(*argv)
    assert done.returncode == 2, (argv, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_every_entry_point_turns_a_busy_port_a_missing_file_or_a_bad_value_into_one_line(
    tmp_path: Path,
) -> None:
    golden = str(Path(__file__).parent / "data" / "trace-v1-golden.rpt")
    missing = str(tmp_path / "missing.rpt")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        proxy = ["proxy", "--upstream", "http://127.0.0.1:9", "--no-record"]
        cases = [
            [*proxy, "--listen", busy, "--admin-listen", ""],
            [*proxy, "--listen", "127.0.0.1:0", "--admin-listen", busy],
            ["sim", "--port", busy.rpartition(":")[2]],
        ]
        for argv in cases:
            assert "address already in use" in _one_line_exit_2(argv)
    target = ["--target", "http://127.0.0.1:9", "-o", str(tmp_path / "r.rpr")]
    for argv in (
        ["inspect", missing],
        ["report", missing.replace(".rpt", ".rpr")],
        ["replay", missing, *target],
        ["export", missing, "--format", "jsonl", "-o", str(tmp_path / "x.jsonl")],
        ["import", missing, "--format", "azure", "-o", str(tmp_path / "x.rpt")],
        ["replay", golden, *target, "--speed", "inf"],
        ["synth", "-o", str(tmp_path / "s.rpt"), "--rate", "inf"],
        ["sim", "--speed", "inf"],
        [*["proxy", "--upstream", "http://127.0.0.1:9", "--no-record"], "--idle-timeout-s", "inf"],
    ):
        _one_line_exit_2(argv)
