"""Exit codes are a contract: 0 success, 1 a run that failed its own criteria (or a bug), 2 bad input.

Every command (as `replayproxy --help` lists them) is given an empty, a truncated, a
future-version and a wrong-kind file where it reads one, and a few bad option values; each must
exit 2 with one line on stderr and no traceback. Run in-process through the CLI's main (no target
is ever reached: the input is refused first; the target, where one is needed, is a closed port).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
import zstandard

from replayproxy import cli
from replayproxy.results import CheckHeader, CheckRow, CheckTarget, CheckWriter, ResultWriter, RunHeader
from tests.cli import run_cli
from tests.test_reader_fuzz import frame_of, join, split_frames

CLOSED = "http://127.0.0.1:9"
FILE_KINDS = ("empty", "truncated", "future", "wrong-kind")


def _future(path: Path) -> bytes:
    """The file with its header's major version one past what this replayproxy reads."""
    frames = split_frames(path.read_bytes())
    header = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(frames[0][1]), raw=False)
    header["version"] += 1
    frames[0] = frame_of(msgpack.packb(header, use_bin_type=True), 0)
    return join(frames)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One valid file of each kind a command reads."""
    d = tmp_path_factory.mktemp("good")
    trace = d / "t.rpt"
    assert run_cli("synth", "-o", str(trace), "--requests", "20", "--seed", "1").returncode == 0
    result = d / "r.rpr"
    with ResultWriter(result, RunHeader(label="a", target=CLOSED, start_wall_ns=1)):
        pass
    check = d / "c.rpc"
    writer = CheckWriter(
        check, CheckHeader(start_wall_ns=1, targets=(CheckTarget("A", CLOSED),), baseline="A")
    )
    writer.write(CheckRow("A", 0, "0", 0))
    writer.close()
    prompts = d / "p.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n' * 3)
    config = d / "c.toml"
    config.write_text('[proxy]\nupstream = "http://127.0.0.1:9"\n')
    profile = d / "profile.json"
    assert run_cli("export", str(trace), "-f", "profile", "-o", str(profile)).returncode == 0
    candidates = d / "candidates.toml"
    candidates.write_text("")  # filled per case below: tune's file is refused before any engine starts
    mooncake = d / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n')
    return {
        "trace": trace, "result": result, "check": check, "prompts": prompts, "config": config,
        "profile": profile, "candidates": candidates, "mooncake": mooncake,
    }  # fmt: skip


def _variant(good: Path, kind: str, wrong: Path, into: Path) -> Path:
    path = into / f"{kind}{good.suffix}"
    data = good.read_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(data[: max(len(data) // 2, 1)] if good.suffix != ".jsonl" else data[:20])
    elif kind == "future":
        path.write_bytes(_future(good))
    else:
        path.write_bytes(wrong.read_bytes())
    return path


# command -> (the good file it reads, a file of another kind, argv with FILE in it, file kinds that apply)
Case = tuple[str, str, Callable[[str, Path], list[str]], tuple[str, ...]]
COLUMN_FILE = FILE_KINDS
TEXT_FILE = ("empty", "truncated", "wrong-kind")
CAPACITY = ["capacity", "--model", "Llama-3.1-8B", "--gpu-memory", "80GiB"]
TUNE = ["--slo", "ttft<=1s", "-o"]
CASES: dict[str, Case] = {
    "replay": (
        "trace", "result", lambda f, d: ["replay", f, "--target", CLOSED, "-o", str(d / "o.rpr")], COLUMN_FILE
    ),
    "report": ("result", "trace", lambda f, d: ["report", f], COLUMN_FILE),
    "report-check": ("check", "trace", lambda f, d: ["report", f], COLUMN_FILE),
    "inspect": ("trace", "result", lambda f, d: ["inspect", f], COLUMN_FILE),
    "export": (
        "trace", "check", lambda f, d: ["export", f, "-f", "mooncake", "-o", str(d / "o.jsonl")], COLUMN_FILE
    ),
    "capacity": ("trace", "check", lambda f, d: [*CAPACITY, f], COLUMN_FILE),
    "capacity-result": ("result", "check", lambda f, d: [*CAPACITY, f], COLUMN_FILE),
    "sweep": (
        "trace", "result",
        lambda f, d: ["sweep", f, "--target", CLOSED, "--speeds", "1", "-o", str(d / "sw")], COLUMN_FILE,
    ),
    "tune": (
        "trace", "result",
        lambda f, d: ["tune", f, "--candidates", str(d / "none.toml"), *TUNE, str(d / "tu")], COLUMN_FILE,
    ),
    "tune-candidates": (
        "candidates", "trace",
        lambda f, d: ["tune", str(d / "t.rpt"), "--candidates", f, *TUNE, str(d / "tu")], TEXT_FILE,
    ),
    "import": (
        "mooncake", "trace", lambda f, d: ["import", f, "-f", "mooncake", "-o", str(d / "o.rpt")], TEXT_FILE
    ),
    "check": (
        "prompts", "trace",
        lambda f, d: ["check", "--target", f"A={CLOSED}", "--prompts", f, "-o", str(d / "o.rpc")], TEXT_FILE,
    ),
    "synth": ("profile", "trace", lambda f, d: ["synth", "--profile", f, "-o", str(d / "o.rpt")], TEXT_FILE),
    "proxy": (
        "config", "trace",
        lambda f, d: ["proxy", "--config", f, "--no-record", "--listen", "127.0.0.1:0"], ("wrong-kind",),
    ),
}  # fmt: skip
BAD_OPTIONS = [
    ["replay", "T", "--target", "http://127.0.0.1:99999", "-o", "O.rpr"],
    ["replay", "T", "--target", "http://127.0.0.1:abc", "-o", "O.rpr"],
    ["replay", "T", "--target", CLOSED, "--speed", "-1", "-o", "O.rpr"],
    ["proxy", "--upstream", "http://127.0.0.1:99999", "--no-record"],
    ["proxy", "--upstream", "http://127.0.0.1:abc", "--no-record"],
    ["report", "T", "--resamples", "nope"],
    ["inspect", "T", "--json", "--nope"],
    ["export", "T", "-f", "mooncake", "--block-size", "0", "-o", "O.jsonl"],
    ["export", "T", "-f", "teleport", "-o", "O.jsonl"],
    ["import", "T", "-f", "mooncake", "--block-size", "-4", "-o", "O.rpt"],
    ["import", "T", "-f", "servegen", "--duration", "inf", "-o", "O.rpt"],
    ["synth", "-o", "O.rpt", "--rate", "nan"],
    ["synth", "-o", "O.rpt", "--requests", "-5"],
    ["capacity", "--model", "Llama-3.1-8B", "--gpu-memory", "lots"],
    ["check", "--target", "A=http://127.0.0.1:99999", "--builtin", "-o", "O.rpc"],
    ["check", "--target", f"A={CLOSED}", "--builtin", "--repeat", "100000", "-o", "O.rpc"],
    ["sweep", "T", "--target", CLOSED, "--speeds", "x", "-o", "D"],
    ["compare", "T", "--target", f"A={CLOSED}", "-o", "D"],
    ["tune", "T", "--candidates", "C", "--slo", "nonsense", "-o", "D"],
    ["demo", "--progress", "loud"],
]


def assert_one_line_exit_2(argv: list[str]) -> None:
    done = run_cli(*argv)
    assert done.returncode == 2, (argv, done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, (argv, done.stderr[-2000:])
    assert lines[0].startswith("replayproxy") and "error" in lines[0], (argv, lines)


def test_the_table_covers_every_command() -> None:
    covered = {argv[0] for argv in BAD_OPTIONS} | {case.partition("-")[0] for case in CASES}
    assert covered >= set(cli.COMMANDS), set(cli.COMMANDS) - covered


@pytest.mark.parametrize(("case", "kind"), [(case, kind) for case, spec in CASES.items() for kind in spec[3]])
def test_a_bad_file_is_one_line_and_exit_2(
    good: dict[str, Path], tmp_path: Path, case: str, kind: str
) -> None:
    reads, other, argv, _ = CASES[case]
    (tmp_path / "t.rpt").write_bytes(good["trace"].read_bytes())
    (tmp_path / "none.toml").write_text("")
    path = _variant(good[reads], kind, good[other], tmp_path)
    assert_one_line_exit_2(argv(str(path), tmp_path))


@pytest.mark.parametrize("argv", BAD_OPTIONS, ids=lambda argv: " ".join(argv[:4]))
def test_a_bad_option_value_is_one_line_and_exit_2(
    good: dict[str, Path], tmp_path: Path, argv: list[str]
) -> None:
    names = {"T": str(good["trace"]), "C": str(good["candidates"]), "O.rpr": str(tmp_path / "o.rpr")}
    names |= {
        "O.rpt": str(tmp_path / "o.rpt"),
        "O.jsonl": str(tmp_path / "o.jsonl"),
        "O.rpc": str(tmp_path / "o.rpc"),
    }
    names["D"] = str(tmp_path / "d")
    assert_one_line_exit_2([names.get(a, a) for a in argv])
