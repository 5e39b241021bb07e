"""Reports over real replays against the simulated engine: prefix cache on vs off, and sweep knees."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replayproxy import clock
from replayproxy.cli import main
from replayproxy.shape import RequestShape, prefix_block_hashes
from replayproxy.trace import TraceHeader, write_trace
from tests.servers import sim

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("replayproxy.replay.command") is None,
        reason="the replayer (replayproxy.replay.command) has not landed yet",
    ),
]

MODEL = "sim-llama-3.1-8b"
KEY = b"report-e2e-key!!"


def shapes(
    n: int, rate_rps: float, shared_tokens: int, own_tokens: int, output_tokens: int
) -> Iterator[RequestShape]:
    """n chat requests sharing their first `shared_tokens` (a long system prompt), evenly spaced."""
    common = list(range(1, shared_tokens + 1))
    for i in range(n):
        tokens = common + [50_000 + 1000 * i + j for j in range(own_tokens)]
        yield RequestShape(
            offset_ns=int(i * 1e9 / rate_rps),
            model=MODEL,
            input_tokens=len(tokens),
            output_tokens=output_tokens,
            max_tokens=output_tokens,
            roles="su",
            prefix_hashes=prefix_block_hashes(tokens, 16, KEY),
            prefix_units=len(tokens),
        )


def write(path: Path, items: Iterator[RequestShape]) -> Path:
    header = TraceHeader(start_wall_ns=0, source="synth", block_size=16)
    write_trace(path, header, items, mono_ns=clock.now_ns, wall_ns=clock.wall_ns)
    return path


def test_prefix_cache_on_is_faster_on_ttft_with_ci_excluding_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write(tmp_path / "shared-prefix.rpt", shapes(24, 10.0, 2000, 48, 4))
    runs = []
    for label, options in (("cache-on", ()), ("cache-off", ("--no-prefix-cache",))):
        with sim(*options) as server:
            out = tmp_path / f"{label}.rpr"
            assert (
                main(
                    [
                        "replay",
                        str(trace),
                        "--target",
                        server.url,
                        "-o",
                        str(out),
                        "--quiet",
                        "--label",
                        label,
                    ]
                )
                == 0
            )
            runs.append(str(out))
    capsys.readouterr()
    html = tmp_path / "report.html"
    assert main(["report", *runs, "--baseline", str(trace), "--json", "--html", str(html)]) == 0
    doc = json.loads(capsys.readouterr().out)
    on, off = doc["runs"][0], doc["runs"][1]
    assert (on["label"], off["label"]) == ("cache-on", "cache-off")
    assert on["errors"]["count"] == 0 and off["errors"]["count"] == 0
    assert on["exact_input_share"] == 1.0
    (cmp,) = [c for c in doc["comparisons"] if c["a"] == "cache-on"]
    ttft = cmp["ttft"]
    assert ttft["pairs"] == 24
    # B (cache off) must prefill 2000 more tokens per request: slower, and the CI says so.
    assert ttft["p50_verdict"] == "B is slower", ttft
    assert ttft["p50_diff_ms"]["ci95_low"] > 0
    assert ttft["median_ratio_b_over_a"] > 1.5 and ttft["share_faster_b"] < 0.2
    text = html.read_text(encoding="utf-8")
    assert text.count("<svg") >= 4 and "cache-off" in text


def sweep_knee(
    trace: Path, out: Path, sim_options: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    with sim("--max-num-seqs", "2", *sim_options) as server:
        code = main(
            [
                "sweep",
                str(trace),
                "--target",
                server.url,
                "--speeds",
                "1,2,4",
                "-o",
                str(out),
                "--json",
                "--replay-args",
                "--no-calibrate",
            ]
        )
    assert code == 0
    (sweep,) = json.loads(capsys.readouterr().out)["sweeps"]
    assert [s["speed"] for s in sweep["steps"]] == [1, 2, 4]
    assert sorted(p.name for p in out.iterdir()) == ["speed-1.rpr", "speed-2.rpr", "speed-4.rpr"]
    return sweep  # type: ignore[no-any-return]


def test_sweep_knee_moves_up_when_the_engine_is_faster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 30 requests at 20 req/s, 16 output tokens each. With 2 sequences at a time the default sim serves
    # about 15 req/s, so it saturates by 2x; eight times faster it serves about 8x more.
    trace = write(tmp_path / "load.rpt", shapes(30, 20.0, 0, 200, 16))
    slow = sweep_knee(trace, tmp_path / "slow", (), capsys)
    fast = sweep_knee(trace, tmp_path / "fast", ("--speed", "8"), capsys)
    assert slow["broke_at_speed"] is not None, slow["knee"]
    assert slow["broke_at_speed"] <= 2, slow["knee"]
    assert (fast["knee_speed"] or 0) > (slow["knee_speed"] or 0), (slow["knee"], fast["knee"])
    assert fast["steps"][-1]["requests_per_s"] > 1.5 * slow["steps"][-1]["requests_per_s"]
