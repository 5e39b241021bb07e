"""Workload profiles: fitted from traces, sampled back; `inspect` of the output agrees with the source.

Tolerances (stated in docs/formats.md): mean rate ±10 %, input/output p50 and p90 ±10 %,
prefix reuse ±0.03 absolute, inter-arrival CV ±20 %, session turns per session ±15 %; --rate-scale 2
doubles the rate (±10 %) and keeps the rest; the 300-row excerpt gets ±30 % (its p90 rests on 30 rows).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replayproxy.formats import azure, mooncake, profile_fit
from replayproxy.formats.exporting import ExportOptions
from replayproxy.formats.importing import ImportOptions, write_imported
from replayproxy.formats.profile_synth import load_profile, profile_header, shapes_from_profile
from replayproxy.synthetic import LengthDist, SynthSpec, generate, header_for
from replayproxy.trace import Columns, TraceHeader, load, write_columns, write_trace
from replayproxy.workload_stats import workload_stats
from tests.formats.helpers import DATA, SHARED_TRACES


def imported(src: Path, tmp_path: Path) -> Columns:
    write_imported(mooncake.read(src, ImportOptions()), tmp_path / "src.rpt", lambda: 0)
    return load(tmp_path / "src.rpt")


def synthesized(fitted: dict[str, Any], tmp_path: Path, **scale: float) -> Columns:
    path = tmp_path / f"synth-{len(list(tmp_path.iterdir()))}.rpt"
    write_trace(
        path, profile_header(fitted), shapes_from_profile(fitted, seed=7, **scale), mono_ns=int, wall_ns=int
    )
    return load(path)


def assert_agree(
    source: dict[str, Any], synth: dict[str, Any], rel: float, reuse_abs: float, cv_rel: float
) -> None:
    assert synth["rate_mean_rps"] == pytest.approx(source["rate_mean_rps"], rel=rel)
    for name in ("input_tokens", "output_tokens"):
        for q in ("p50", "p90"):
            assert synth[name][q] == pytest.approx(source[name][q], rel=rel), (name, q)
    assert synth["prefix_reuse"] == pytest.approx(source["prefix_reuse"], abs=reuse_abs)
    assert synth["interarrival_cv"] == pytest.approx(source["interarrival_cv"], rel=cv_rel)


def test_profile_of_the_published_excerpt_and_synth_agree(tmp_path: Path) -> None:
    cols = imported(DATA / "mooncake_conversation_head300.jsonl", tmp_path)
    fitted = profile_fit.fit_profile(cols)
    assert fitted["requests"] == 300 and fitted["prefix"]["big_groups"] == [1.0]  # all share block 0
    assert len(fitted["lengths"]["input_tokens"]) == profile_fit.QUANTILES
    synth = synthesized(fitted, tmp_path, duration_s=fitted["duration_s"] * 10)  # 10x longer: less noise
    assert_agree(workload_stats(cols), workload_stats(synth), rel=0.3, reuse_abs=0.06, cv_rel=0.35)
    assert profile_fit.fit_profile(synth)["prefix"]["big_groups"][0] > 0.95


@pytest.mark.skipif(
    not (SHARED_TRACES / "conversation_trace.jsonl").exists(), reason="public traces not present"
)
def test_full_public_trace_profile_synth_and_rate_scale(tmp_path: Path) -> None:
    cols = imported(SHARED_TRACES / "conversation_trace.jsonl", tmp_path)
    source = workload_stats(cols)
    fitted = profile_fit.fit_profile(cols, inspect=source)
    assert_agree(source, workload_stats(synthesized(fitted, tmp_path)), rel=0.1, reuse_abs=0.03, cv_rel=0.2)
    doubled = workload_stats(synthesized(fitted, tmp_path, rate_scale=2.0))
    assert doubled["rate_mean_rps"] == pytest.approx(2 * source["rate_mean_rps"], rel=0.1)
    assert doubled["input_tokens"]["p50"] == pytest.approx(source["input_tokens"]["p50"], rel=0.1)
    assert doubled["prefix_reuse"] == pytest.approx(source["prefix_reuse"], abs=0.03)


def per_minute_rate_cv(cols: Columns) -> float:
    """How much the request rate varies from minute to minute (CV of the per-minute counts)."""
    counts = np.bincount(((cols.offset_ns - cols.offset_ns[0]) // 60_000_000_000).astype(np.int64))
    return float(counts.std() / counts.mean())


@pytest.mark.parametrize(
    ("name", "reader"),
    [("conversation_trace.jsonl", mooncake.read), ("AzureLLMInferenceTrace_conv.csv", azure.read)],
)
def test_rate_variability_carries_over_at_1x_and_2x(tmp_path: Path, name: str, reader: Any) -> None:
    """Per-minute rate CV and inter-arrival CV within 15 %: the Mooncake trace's regular ~3 s clumps
    (gap CV 3, steady minutes) would double the per-minute CV as a gamma renewal process."""
    if not (SHARED_TRACES / name).exists():
        pytest.skip(f"public trace {name} not present in {SHARED_TRACES}")
    write_imported(reader(SHARED_TRACES / name, ImportOptions()), tmp_path / "src.rpt", lambda: 0)
    cols = load(tmp_path / "src.rpt")
    fitted = profile_fit.fit_profile(cols)
    for rate_scale in (1.0, 2.0):
        synth = synthesized(fitted, tmp_path, rate_scale=rate_scale)
        assert per_minute_rate_cv(synth) == pytest.approx(per_minute_rate_cv(cols), rel=0.15), rate_scale
        assert workload_stats(synth)["interarrival_cv"] == pytest.approx(
            workload_stats(cols)["interarrival_cv"], rel=0.15
        ), rate_scale


def test_sessions_and_length_scale(tmp_path: Path) -> None:
    spec = SynthSpec(
        requests=3000,
        rate_rps=20,
        sessions_share=0.6,
        turns=LengthDist("uniform", low=2, high=6),
        think_s=2.0,
        prefix_groups=3,
        prefix_len_tokens=600,
        seed=3,
    )
    write_trace(tmp_path / "s.rpt", header_for(spec), generate(spec), mono_ns=int, wall_ns=int)
    cols = load(tmp_path / "s.rpt")
    fitted = profile_fit.fit_profile(cols)
    synth = synthesized(fitted, tmp_path, length_scale=2.0)

    def turns_per_session(c: Columns) -> float:
        inside = c.session[c.session != 0]
        return len(inside) / len(np.unique(inside))

    assert turns_per_session(synth) == pytest.approx(turns_per_session(cols), rel=0.15)
    assert (synth.session != 0).mean() == pytest.approx((cols.session != 0).mean(), abs=0.05)
    source, scaled = workload_stats(cols), workload_stats(synth)
    assert scaled["input_tokens"]["p50"] == pytest.approx(2 * source["input_tokens"]["p50"], rel=0.1)
    assert scaled["rate_mean_rps"] == pytest.approx(source["rate_mean_rps"], rel=0.1)
    follow_up = np.flatnonzero(synth.turn > 0)
    assert len(follow_up) and all(len(synth.hashes_of(int(i))) > 0 for i in follow_up[:20])


def test_profile_export_and_load(tmp_path: Path) -> None:
    cols = imported(DATA / "mooncake_conversation_head300.jsonl", tmp_path)
    result = profile_fit.write(cols, tmp_path / "p.json", ExportOptions(inspect={"requests": 300}))
    loaded = load_profile(tmp_path / "p.json")
    assert loaded["inspect"] == {"requests": 300} and "synth --profile" in result.notes[0]
    (tmp_path / "bad.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a replayproxy profile"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "new.json").write_text(json.dumps({**loaded, "version": 99}))
    with pytest.raises(ValueError, match="newer"):
        load_profile(tmp_path / "new.json")


def test_traces_without_prefix_information(tmp_path: Path) -> None:
    from replayproxy.formats import azure

    write_imported(azure.read(DATA / "azure_conv_2023_head60.csv", ImportOptions()), tmp_path / "a.rpt", int)
    fitted = profile_fit.fit_profile(load(tmp_path / "a.rpt"))
    assert fitted["prefix"]["reuse_ratio"] == 0.0 and fitted["sessions"]["share"] == 0.0
    synth = synthesized(fitted, tmp_path)
    assert len(synth.prefix_hashes) == 0 and len(synth) > 20


def small_groups_trace(path: Path, requests: int = 3000) -> Path:
    """Sharing spread over many groups of 2-7 requests, each member at least as long as its group's prefix."""
    rng = np.random.default_rng(3)
    offsets: list[float] = []
    prompts: list[list[int]] = []
    start, group = 0.0, 0
    while len(offsets) < requests:
        group += 1
        shared = [group * 1000 + k for k in range(int(rng.integers(4, 20)))]
        for member in range(int(rng.integers(2, 8))):
            own = [-(len(offsets) * 100 + k) for k in range(int(rng.integers(0, 6)))]
            offsets.append(start + rng.exponential(2.0) * member)
            prompts.append(shared + own)
        start += rng.exponential(0.4)
    order = np.argsort(offsets)
    ids = [prompts[i] for i in order]
    counts = np.array([len(p) for p in ids])
    inputs = counts * 512 + rng.integers(0, 511, len(ids))
    hashes = np.array([hash(tuple(p[: k + 1])) & (2**63 - 1) for p in ids for k in range(len(p))], np.uint64)
    columns = {
        "offset_ns": (np.asarray(offsets)[order] * 1e9).astype(np.int64),
        "input_tokens": inputs,
        "output_tokens": rng.integers(20, 600, len(ids)),
        "status": 200,
        "prefix_hashes": (hashes, counts),
        "prefix_units": inputs,
    }
    header = TraceHeader(start_wall_ns=0, source="test", block_size=512, block_unit="token")
    write_columns(path, header, columns, len(ids), wall_ns=lambda: 0)
    return path


@pytest.mark.parametrize("rate_scale", [1.0, 2.0])
def test_many_small_prefix_groups_keep_their_reuse(tmp_path: Path, rate_scale: float) -> None:
    cols = load(small_groups_trace(tmp_path / "small.rpt"))
    fitted = profile_fit.fit_profile(cols)
    assert fitted["prefix"]["big_groups"] == [] and len(fitted["prefix"]["small_sizes"]) == 6
    source = workload_stats(cols)
    for seed in (0, 1, 2):
        path = tmp_path / f"s{seed}.rpt"
        shapes = shapes_from_profile(fitted, seed=seed, rate_scale=rate_scale)
        write_trace(path, profile_header(fitted), shapes, mono_ns=int, wall_ns=int)
        synth = workload_stats(load(path))
        assert synth["prefix_reuse"] == pytest.approx(source["prefix_reuse"], abs=0.03), seed
        for name in ("input_tokens", "output_tokens"):
            assert synth[name]["p50"] == pytest.approx(source[name]["p50"], rel=0.05), (name, seed)


def test_block_reuse_of_hashes_kept_on_disk_is_counted_by_value_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export keeps the hashes mapped; the profile then counts first sightings one value range
    at a time: the same counts as the whole-trace sort."""
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 25, 3000)
    pool = rng.integers(1, 2**63, 2000).astype(np.uint64)
    columns = {
        "offset_ns": np.arange(3000) * 1_000_000,
        "input_tokens": counts * 16,
        "status": 200,
        "prefix_hashes": (pool[rng.integers(0, len(pool), int(counts.sum()))], counts),
        "prefix_units": counts * 16,
    }
    header = TraceHeader(start_wall_ns=0, source="test", block_size=16, block_unit="token")
    path = tmp_path / "t.rpt"
    write_columns(path, header, columns, 3000, wall_ns=lambda: 0)
    monkeypatch.setattr("replayproxy.trace.reuse.HASHES_PER_RANGE", 500)
    held = profile_fit.block_reuse(load(path))
    mapped = profile_fit.block_reuse(load(path, ragged_on_disk=True))
    assert held[1].sum() > 1000 and np.array_equal(held[0], mapped[0]) and np.array_equal(held[1], mapped[1])
