"""Hostile imports: a thousand mutations of a small file per importer, each read under an address-space limit.

Values swapped for huge, negative, fractional, non-finite, wrong-typed or absurdly long ones, keys
and fields dropped, lines duplicated and bytes flipped. Every import must end in a trace (on a
share of the cases also written) or in the project's own one-line error: no traceback, no
MemoryError, no hang. The mutations run in two subprocesses (imports once, one core each) whose
address space is limited to what they used before plus 300 MB: a single value that would size an
array past it (the jsonl `input_tokens` of 2**31 took 6.6 GB) shows as a MemoryError here.
"""

from __future__ import annotations

import json
import random
import resource
import signal
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.fuzz_workers import run_workers  # noqa: E402  (ROOT is on the path when run as a worker)

MUTATIONS = 1000  # per importer
PER_IMPORT_S = 5.0
HUGE = [2**24 + 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63), 10**30, 1e308, -1e308, 1e-300]
ODD_TEXT = [
    "",
    "-1",
    "nan",
    "inf",
    "-inf",
    "1e308",
    "9" * 40,
    "0x10",
    "1,5",
    "\u00e9",
    "2024-13-45 25:61:00",
    "x",
]


def odd(rng: random.Random) -> Any:
    return rng.choice([
        None, True, -1, 0, 1.5, rng.choice(HUGE), "x", rng.choice(ODD_TEXT), [], [1, -2], [rng.choice(HUGE)],
        {"a": 1}, list(range(rng.randint(0, 3000))), "y" * rng.randint(0, 5000),
    ])  # fmt: skip


def seeds(directory: Path) -> dict[str, Path]:
    """A small valid file (or ServeGen directory) per importer."""
    data = ROOT / "tests" / "data" / "formats"
    files: dict[str, Path] = {}
    mooncake = (data / "mooncake_conversation_head300.jsonl").read_text().splitlines()[:25]
    files["mooncake"] = directory / "mooncake.jsonl"
    files["mooncake"].write_text("\n".join(mooncake) + "\n")
    sessions = [
        {"session_id": "s", "input_length": 600, "output_length": 3, "hash_ids": [0, 1], "timestamp": 0},
        {"session_id": "s", "delay": 1500, "input_length": 40, "output_length": 3, "hash_ids": [2]},
    ]
    files["mooncake-sessions"] = directory / "mooncake-sessions.jsonl"
    files["mooncake-sessions"].write_text("".join(json.dumps(r) + "\n" for r in sessions * 4))
    bailian = [
        {"chat_id": i, "parent_chat_id": i - 1 if i % 3 else -1, "timestamp": i * 0.5, "input_length": 40 + i,
         "output_length": 7, "type": "text", "turn": i % 3 + 1, "hash_ids": []}
        for i in range(12)
    ]  # fmt: skip
    for row in bailian:
        row["hash_ids"] = list(range(-(-row["input_length"] // 16)))
    files["bailian"] = directory / "bailian.jsonl"
    files["bailian"].write_text("".join(json.dumps(r) + "\n" for r in bailian))
    files["azure"] = directory / "azure.csv"
    files["azure"].write_text(
        "\n".join((data / "azure_conv_2023_head60.csv").read_text().splitlines()[:25]) + "\n"
    )
    files["burstgpt"] = directory / "burstgpt.csv"
    files["burstgpt"].write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        + "".join(f"{i * 3},s{i % 3},{i / 4},ChatGPT,{100 + i},{20 + i},{120 + 2 * i},Conversation log\n"
                  for i in range(15))
    )  # fmt: skip
    files["jsonl"] = directory / "own.jsonl"
    files["jsonl"].write_text("".join(
        json.dumps({"offset_s": i * 0.5, "input_tokens": 300 + i, "output_tokens": 20, "max_tokens": 64,
                    "session": f"u{i % 3}", "turn": i // 3, "prefix": [["sys", 200], ["doc", 50]],
                    "model": "m"}) + "\n"
        for i in range(12)
    ))  # fmt: skip
    rounds = []
    for i in range(10):
        total = 1000 + 100 * i
        rounds.append({
            "session_id": "ab"[i % 2], "round_index": i // 2, "model": "claude", "input_tokens_total": total,
            "prefix_tokens": 0 if i < 2 else total - 100, "newly_append_tokens": 100 if i >= 2 else total,
            "output_tokens": 30, "timing_events": [
                {"event_type": "user_message", "timestamp": f"2025-06-01T10:00:{i * 5:02d}Z"},
                {"event_type": "tool_call", "timestamp": f"2025-06-01T10:00:{i * 5 + 2:02d}Z"},
            ],
        })  # fmt: skip
    files["tracelab"] = directory / "tracelab.jsonl"
    files["tracelab"].write_text("".join(json.dumps(r) + "\n" for r in rounds))
    servegen = directory / "servegen"
    servegen.mkdir()
    (servegen / "chunk-0-trace.csv").write_text("0,1.5,1.0,Gamma,1.0,0.6\n600,0.5,1.0,Weibull,0.5,2.0\n")
    (servegen / "chunk-0-dataset.json").write_text(json.dumps({
        "0": {"input_tokens": "{224: 0.25, 225: 0.5, 300: 0.25}", "output_tokens": "{40: 0.5, 41: 0.5}"},
        "600": {"input_tokens": "{1000: 1.0}", "output_tokens": "{7: 0.2, 9: 0.8}"},
    }))  # fmt: skip
    files["servegen"] = servegen
    return files


def mutate_json_lines(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        how = rng.randrange(10)
        if how < 6:
            try:
                row = json.loads(lines[i])
            except ValueError:
                continue
            if isinstance(row, dict) and row:
                key = rng.choice(list(row))
                if how == 5:
                    del row[key]
                elif isinstance(row[key], list) and row[key] and rng.random() < 0.5:
                    row[key][rng.randrange(len(row[key]))] = odd(rng)
                elif isinstance(row[key], dict) and row[key]:
                    row[key][rng.choice(list(row[key]))] = odd(rng)
                else:
                    row[key] = odd(rng)
            lines[i] = json.dumps(row, allow_nan=True)
        elif how == 6:
            lines.insert(rng.randrange(len(lines)), lines[i])
        elif how == 7:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        else:
            raw = bytearray(lines[i].encode())
            if raw:
                raw[rng.randrange(len(raw))] = rng.choice([0x22, 0x5D, 0x7B, 0x30, 0x2D, 0x65, 0xFF])
            lines[i] = raw.decode("utf-8", "replace")
    return "\n".join(lines) + "\n"


def mutate_csv(text: str, rng: random.Random, header: bool = True) -> str:
    lines = text.splitlines()
    first = 1 if header and len(lines) > 1 else 0
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(first, len(lines))
        fields = lines[i].split(",")
        how = rng.randrange(8)
        if how < 5:
            fields[rng.randrange(len(fields))] = rng.choice([*ODD_TEXT, str(rng.choice(HUGE))])
        elif how == 5:
            fields.pop(rng.randrange(len(fields)))
        elif how == 6:
            fields.append(rng.choice(ODD_TEXT))
        else:
            lines.insert(rng.randrange(first, len(lines) + 1), lines[i])
        lines[i] = ",".join(fields)
    return "\n".join(lines) + "\n"


def mutated(name: str, seed: Path, rng: random.Random, into: Path) -> Path:
    if name == "servegen":
        target = into / "servegen"
        target.mkdir(exist_ok=True)
        trace, dataset = (seed / "chunk-0-trace.csv").read_text(), (seed / "chunk-0-dataset.json").read_text()
        if rng.random() < 0.5:
            trace = mutate_csv(trace, rng, header=False)
        else:
            windows = json.loads(dataset)
            window = windows[rng.choice(list(windows))]
            field = rng.choice(list(window))
            entries = window[field].strip("{}").split(", ")
            value, _, p = entries[rng.randrange(len(entries))].partition(": ")
            pick = rng.choice([f"{rng.choice(HUGE)}: {p}", f"{value}: {rng.choice(ODD_TEXT)}", "x", ""])
            window[field] = "{" + ", ".join([*entries[:-1], pick]) + "}" if rng.random() < 0.8 else odd(rng)
            dataset = json.dumps(windows)
        (target / "chunk-0-trace.csv").write_text(trace)
        (target / "chunk-0-dataset.json").write_text(dataset)
        return target
    path = into / seed.name
    text = seed.read_text()
    path.write_text(mutate_csv(text, rng) if seed.suffix == ".csv" else mutate_json_lines(text, rng))
    return path


class Hang(Exception):
    """An import that took longer than PER_IMPORT_S."""


def _on_alarm(signum: int, frame: object) -> None:
    raise Hang()


def worker(count: int, seed: int, names: list[str]) -> None:
    warnings.simplefilter("error")  # an overflowing cast writes a wrong value silently: a failure here
    from replayproxy.errors import UserError
    from replayproxy.formats.importing import ImportOptions, write_imported
    from replayproxy.formats.registry import reader

    directory = Path(tempfile.mkdtemp(prefix="import-fuzz-"))
    sources = seeds(directory)
    for name in names:  # warm: imports, caches; and the seeds must import
        write_imported(
            reader(name.partition("-")[0])(sources[name], ImportOptions()), directory / "w.rpt", lambda: 0
        )
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = used + (300 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    outcomes: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    rng = random.Random(seed)
    work = directory / "work"
    work.mkdir()
    for name in names:
        read = reader(name.partition("-")[0])
        for _ in range(count):
            path = mutated(name, sources[name], rng, work)
            signal.setitimer(signal.ITIMER_REAL, PER_IMPORT_S)
            try:
                imported = read(path, ImportOptions(skip_bad=rng.random() < 0.5))
                if len(imported) and rng.random() < 0.25:
                    write_imported(imported, work / "out.rpt", lambda: 0)
                outcomes[f"{name}: imported"] += 1
            except Hang:
                failures[f"{name}: hang"] += 1
            except UserError:
                outcomes[f"{name}: refused"] += 1
            except MemoryError:
                failures[f"{name}: MemoryError"] += 1
            except Exception as e:  # noqa: BLE001 — every failure is what this test counts
                where = traceback.extract_tb(e.__traceback__)[-1]
                failures[
                    f"{name}: {type(e).__name__}: {str(e)[:80]} at {Path(where.filename).name}:{where.lineno}"
                ] += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    print(json.dumps({"outcomes": outcomes, "failures": failures, "limit_mb": limit >> 20}))


@pytest.mark.timeout(200)
def test_hostile_imports_never_crash_exhaust_memory_or_hang() -> None:
    groups = ("mooncake,mooncake-sessions,azure,burstgpt", "bailian,jsonl,tracelab,servegen")
    summary = run_workers(__file__, MUTATIONS, list(enumerate(groups, 1)), timeout_s=190)
    assert not summary["failures"], json.dumps(summary, indent=1)
    for names in groups:
        for name in names.split(","):
            done = summary["outcomes"][f"{name}: imported"] + summary["outcomes"][f"{name}: refused"]
            assert done == MUTATIONS and summary["outcomes"][f"{name}: imported"] > MUTATIONS // 10, name


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","))
