"""Multi-turn sessions replayed against a sim slower than production: closed loop keeps every
session's turns apart with the recorded think times; open loop keeps today's schedule (and overlaps)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from replayproxy.cli import main
from replayproxy.report.document import build_document
from replayproxy.report.runs import load_runs
from replayproxy.report.sections import report_tables
from replayproxy.results import ResultFile
from replayproxy.shape import RequestShape, prefix_block_hashes
from replayproxy.trace import load
from tests.e2e.test_replay_sim import replay
from tests.replay import traces
from tests.servers import sim

pytestmark = pytest.mark.slow

MS = 1_000_000
SESSIONS, TURNS = 10, 4
RECORDED_E2E_MS, THINK_MS = 60, 40  # production answered in 60 ms; the sim at --speed 0.5 takes longer


def session_shapes(
    sessions: int = SESSIONS, turns: int = TURNS, think_ms: int = THINK_MS, output_tokens: int = 12
) -> list[RequestShape]:
    """Sessions 250 ms apart; each turn's prompt is the last one, its reply and a new user message
    (also the trace of benchmarks/session_fidelity.py)."""
    shapes = []
    for s in range(sessions):
        offset, units = s * 250 * MS, list(range(s * 10_000, s * 10_000 + 96))
        for t in range(turns):
            shapes.append(
                RequestShape(
                    offset_ns=offset,
                    model=traces.SIM_MODEL,
                    input_tokens=len(units),
                    output_tokens=output_tokens,
                    max_tokens=output_tokens,
                    roles="su" + "au" * t,
                    prefix_hashes=prefix_block_hashes(units, 16, b"k"),
                    prefix_units=len(units),
                    status=200,
                    e2e_ns=RECORDED_E2E_MS * MS,
                    session=1000 + s,
                    turn=t,
                    think_ns=think_ms * MS if t else -1,
                )
            )
            offset += (RECORDED_E2E_MS + think_ms) * MS
            units += list(range(units[-1] + 1, units[-1] + 1 + output_tokens + 20))  # the reply, the new turn
    return sorted(shapes, key=lambda shape: shape.offset_ns)


def think_times_ms(result: ResultFile) -> tuple[np.ndarray, np.ndarray]:
    """Per later turn: the think time it got (send − end of the previous turn) and the planned one."""
    index, sent, e2e = (result.column(c) for c in ("index", "sent_ns", "e2e_ns"))
    end_of = dict(zip(index.tolist(), (sent + e2e).tolist(), strict=True))
    after, planned = result.column("after"), result.column("think_ns")
    later = after >= 0
    got = sent[later] - np.array([end_of[a] for a in after[later].tolist()])
    return got / 1e6, planned[later] / 1e6


@pytest.mark.serial  # think-time and lag bounds in milliseconds
def test_closed_loop_never_overlaps_a_session_and_reproduces_think_times(tmp_path: Path) -> None:
    trace = traces.write(tmp_path / "sessions.rpt", session_shapes())
    with sim("--speed", "0.5") as server:
        closed = replay(trace, server.url, tmp_path / "closed.rpr", "--no-calibrate")
        open_loop = replay(trace, server.url, tmp_path / "open.rpr", "--no-calibrate", "--sessions", "open")
    assert closed.header.pre_run["sessions"] == "closed" and open_loop.header.pre_run["sessions"] == "open"
    assert not any(closed.column("error")) and len(closed) == SESSIONS * TURNS

    got, planned = think_times_ms(closed)
    assert len(got) == SESSIONS * (TURNS - 1) and np.all(planned == THINK_MS)
    assert got.min() >= THINK_MS  # no turn before its previous one ended: zero overlaps
    errors = got - planned
    # generous on a shared machine: the tight figure is benchmarks/session_fidelity.py's
    assert np.percentile(errors, 50) < 10.0 and np.percentile(errors, 99) < 100.0
    lags_ms = (closed.column("sent_ns") - closed.column("scheduled_ns")) / 1e6  # against the dynamic schedule
    assert lags_ms.min() >= 0 and np.percentile(lags_ms, 50) < 10.0

    # open loop: today's schedule, which on this slower engine overlaps turns of one session
    cols = load(trace)
    scheduled = open_loop.column("scheduled_ns")
    assert np.array_equal(scheduled, cols.offset_ns[open_loop.column("index")] - cols.offset_ns[0])
    open_got, _ = think_times_ms(open_loop)
    assert np.sum(open_got < 0) >= SESSIONS  # a turn sent while the previous one still ran

    # the report says the same, per session, beside the per-request figures
    doc = build_document(load_runs([tmp_path / "closed.rpr", tmp_path / "open.rpr"]))
    closed_doc, open_doc = (run["sessions"] for run in doc["runs"])
    assert closed_doc["overlapping_turns"] == 0 and open_doc["overlapping_turns"] == np.sum(open_got < 0)
    assert closed_doc["turns_per_session"]["p50"] == TURNS and closed_doc["later_turns"] == len(got)
    assert closed_doc["think_error_ms"]["p50"] == pytest.approx(np.percentile(errors, 50))
    assert closed_doc["session_s"]["p50"] > (TURNS - 1) * THINK_MS / 1e3
    assert "Sessions" in [table.title for table in report_tables(doc)]


def test_limit_and_sampling_keep_whole_sessions(tmp_path: Path) -> None:
    trace = traces.write(tmp_path / "sessions.rpt", session_shapes())
    with sim("--speed", "20") as server:
        limited = replay(trace, server.url, tmp_path / "l.rpr", "--no-calibrate", "--limit", "5")
        sampled = replay(trace, server.url, tmp_path / "s.rpr", "--no-calibrate", "--sample-sessions", "0.5")
        again = replay(trace, server.url, tmp_path / "a.rpr", "--no-calibrate", "--sample-sessions", "0.5")
    for result in (limited, sampled):
        turns_per_session = np.unique(result.column("session"), return_counts=True)[1]
        assert np.all(turns_per_session == TURNS)
    assert len(limited) == 2 * TURNS  # 5 requests need two whole sessions
    assert 0 < len(sampled) < SESSIONS * TURNS
    assert np.array_equal(np.sort(sampled.column("index")), np.sort(again.column("index")))  # seeded


def tokenize_calls(url: str) -> int:
    """The sim's count of the POST /tokenize it answered (vLLM's http_requests_total)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(r'http_requests_total\{handler="/tokenize"[^}]*\} (\S+)', text)
    assert found, "the sim exports no /tokenize count"
    return int(float(found.group(1)))


def test_without_a_local_tokenizer_the_run_counts_its_calls_to_the_engine(
    tmp_path: Path, bpe_tokenizer: Path
) -> None:
    """The sim serves a tokenizer file no local lookup finds: each live turn is sized by one call to
    its /tokenize during the run, and the result says how many the run made (the sim's own count)."""
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(bpe_tokenizer, served / "bpe.json")
    shutil.copy(bpe_tokenizer.parent / "tokenizer_config.json", served / "tokenizer_config.json")
    sessions, turns_per = 2, 3
    trace = traces.write(tmp_path / "live.rpt", session_shapes(sessions, turns_per, THINK_MS, 12))
    with sim("--tokenizer", str(served / "bpe.json"), "--speed", "0.5") as server:
        before = tokenize_calls(server.url)
        run = replay(trace, server.url, tmp_path / "live.rpr", "--no-calibrate")
        after = tokenize_calls(server.url)
    prompts = run.header.pre_run["prompts"]
    assert prompts["tokenizer"] == "vllm /tokenize" and "no local copy" in prompts["tokenizer_source"]
    [live] = run.extras["live_replies"]
    assert live["built"] == sessions * (turns_per - 1) == live["target_calls"]
    assert before == 0 and after > live["target_calls"]  # the rest: measuring prompts before the clock


def test_live_replies_reach_the_cache_as_production_did_on_a_slower_engine(
    tmp_path: Path, bpe_tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each later turn carries the sim's own 40-token reply, sized to the recorded length through
    the sim's BPE: every prompt is exact, and the sim's cache hits the reply's blocks too."""
    sessions, turns_per, reply = 3, 3, 40
    trace = traces.write(tmp_path / "live.rpt", session_shapes(sessions, turns_per, THINK_MS, reply))
    with sim("--tokenizer", str(bpe_tokenizer), "--speed", "0.5") as server:
        run = replay(trace, server.url, tmp_path / "live.rpr", "--no-calibrate")
        calls = tokenize_calls(server.url)
    prompts = run.header.pre_run["prompts"]
    assert prompts["replies"].startswith("live") and prompts["tokenizer"] == "tokenizer.json"
    assert prompts["tokenizer_source"] == "found: /v1/models root"  # the sim names its model directory
    [live] = run.extras["live_replies"]  # counts only; the sim's replies re-tokenize to their own ids
    assert live["built"] == sessions * (turns_per - 1) and live["short"] == 0 and not live["planned"]
    assert live["reply_tokens_as_generated"] == live["reply_tokens"] == sessions * (turns_per - 1) * reply
    assert live["target_calls"] == 0  # the replies were sized with the local copy of the tokenizer
    assert calls <= 7  # the probes comparing it with the engine's endpoint, before the clock
    assert {k: type(v) for k, v in live.items()} == {  # no text of any reply is kept
        "type": str, "built": int, "short": int, "planned": dict, "reply_tokens": int,
        "reply_tokens_as_generated": int, "target_calls": int,
    }  # fmt: skip
    summary = run.footer["summary"]
    assert summary["errors"] == 0 and summary["input_exact"] == 1.0 and summary["output_exact"] == 1.0
    got, planned = think_times_ms(run)
    assert len(got) == sessions * (turns_per - 1) and got.min() >= planned.min()  # no overlaps
    inputs = dict(zip(run.column("index").tolist(), run.column("prompt_tokens").tolist(), strict=True))
    for after, cached in zip(run.column("after").tolist(), run.column("cached_tokens").tolist(), strict=True):
        if after >= 0:  # the previous prompt and the reply but its last token, in whole 16-token blocks
            assert cached == (inputs[after] + reply - 1) // 16 * 16 > inputs[after] // 16 * 16
    capsys.readouterr()
    assert main(["report", str(tmp_path / "live.rpr"), "--json"]) == 0
    cache = json.loads(capsys.readouterr().out)["runs"][0]["prefix_cache"]
    assert abs(cache["engine_over_implied"] - 1) <= 0.01, cache
    assert main(["report", str(tmp_path / "live.rpr"), "--baseline", str(trace), "--json"]) == 0
    [fidelity] = json.loads(capsys.readouterr().out)["fidelity"]  # the replay of production's own trace
    assert [(f["figure"], f["quantile"]) for f in fidelity["figures"]] == [
        ("TTFT", 50), ("TTFT", 95), ("TPOT", 50), ("TPOT", 95), ("E2E", 50), ("E2E", 95)
    ]  # fmt: skip
    e2e = fidelity["figures"][4]  # production answered in 60 ms; the sim at --speed 0.5 is slower
    assert e2e["production_ms"] == RECORDED_E2E_MS and e2e["replay_ms"] > RECORDED_E2E_MS
    assert e2e["difference"] > 0 and not fidelity["reproduces"]
    calls = next(d for d in fidelity["differences"] if d["name"] == "extra calls to the target")
    assert calls["value"] == 0 and calls["effect"] == ""
    assert main(["report", str(tmp_path / "live.rpr"), "--baseline", str(trace)]) == 0
    text = capsys.readouterr().out
    assert text.index("Fidelity: ") > text.index("Verdict") and "known differences:" in text
