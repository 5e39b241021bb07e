"""Synthetic workloads: determinism, statistics, shared prefixes and sessions (replayproxy/synthetic.py)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from replayproxy import trace
from replayproxy.shape import prefix_block_hashes
from replayproxy.synthetic import LengthDist, SynthSpec, generate, header_for, parse_arrival
from replayproxy.workload_stats import workload_stats


def write(path: Path, spec: SynthSpec) -> Path:
    trace.write_trace(path, header_for(spec), generate(spec), mono_ns=lambda: 0, wall_ns=lambda: 0)
    return path


def test_same_seed_same_bytes_other_seed_other_trace(tmp_path: Path) -> None:
    spec = SynthSpec(
        requests=500, prefix_groups=3, prefix_len_tokens=100, sessions_share=0.4, arrival_cv=3.0, seed=5
    )
    first, second = write(tmp_path / "a.rpt", spec), write(tmp_path / "b.rpt", spec)
    assert first.read_bytes() == second.read_bytes()
    other = write(tmp_path / "c.rpt", SynthSpec(**{**_fields(spec), "seed": 6}))
    assert other.read_bytes() != first.read_bytes()
    (header,) = trace.load(first).headers
    assert header.source == "synth" and header.start_wall_ns == 0 and header.created_wall_ns == 0
    assert header.block_size == 16 and header.block_unit == "token" and header.key_fingerprint
    assert header.extra["synth"]["seed"] == 5 and header.extra["synth"]["input_len"].startswith(
        "lognormal:mean=1000"
    )


def _fields(spec: SynthSpec) -> dict[str, object]:
    return {name: getattr(spec, name) for name in SynthSpec.__dataclass_fields__}


@pytest.mark.parametrize(("arrival", "cv"), [("poisson", 1.0), ("gamma:0.5", 0.5), ("gamma:3", 3.0)])
def test_arrival_rate_and_burstiness(arrival: str, cv: float) -> None:
    spec = SynthSpec(
        requests=20_000,
        rate_rps=40,
        arrival_cv=parse_arrival(arrival),
        input_len=LengthDist.parse("fixed:16"),
    )
    offsets = np.array([s.offset_ns for s in generate(spec)])
    gaps_s = np.diff(offsets) / 1e9
    assert offsets[0] == 0 and (gaps_s >= 0).all()
    assert 1 / gaps_s.mean() == pytest.approx(40, rel=0.06)
    assert gaps_s.std() / gaps_s.mean() == pytest.approx(cv, rel=0.1)


def test_duration_bounds_the_trace() -> None:
    offsets = [
        s.offset_ns
        for s in generate(SynthSpec(duration_s=100, rate_rps=20, input_len=LengthDist.parse("fixed:1")))
    ]
    assert max(offsets) < 100 * 10**9
    assert len(offsets) == pytest.approx(2000, rel=0.1)


@pytest.mark.parametrize(
    ("text", "check"),
    [
        ("fixed:512", lambda v: set(v) == {512}),
        (
            "uniform:100,200",
            lambda v: min(v) >= 100 and max(v) <= 200 and statistics.mean(v) == pytest.approx(150, rel=0.03),
        ),
        ("lognormal:mean=800,sigma=0.8", lambda v: statistics.mean(v) == pytest.approx(800, rel=0.06)),
        ("lognormal:mean=800,sigma=0.5,max=1000", lambda v: max(v) == 1000 and min(v) >= 1),
    ],
)
def test_length_distributions(text: str, check: object) -> None:
    spec = SynthSpec(requests=5000, input_len=LengthDist.parse(text), output_len=LengthDist.parse(text))
    shapes = list(generate(spec))
    assert check([s.input_tokens for s in shapes])  # type: ignore[operator]
    assert check([s.output_tokens for s in shapes])  # type: ignore[operator]
    assert all(s.max_tokens == s.output_tokens for s in shapes)


def test_group_prefixes_share_hashes_and_reuse_is_as_expected(tmp_path: Path) -> None:
    spec = SynthSpec(
        requests=3000, prefix_groups=5, prefix_len_tokens=520, input_len=LengthDist.parse("fixed:1000")
    )
    shapes = list(generate(spec))
    by_lead = defaultdict(list)
    for shape in shapes:
        assert shape.input_tokens == 1000 and len(shape.prefix_hashes) == 1000 // 16 and shape.roles == "su"
        by_lead[shape.prefix_hashes[0]].append(shape.prefix_hashes)
    assert len(by_lead) == 5  # five system prompts
    sizes = sorted(len(v) for v in by_lead.values())
    assert sizes[-1] > 1.5 * sizes[0]  # popularity is skewed (weight 1/(g+1))
    for members in by_lead.values():
        assert len({m[: 520 // 16] for m in members}) == 1  # the whole shared prompt's full blocks agree
        assert len({m[520 // 16] for m in members}) == len(members)  # the block past it is the request's own
    # An infinite cache hits every shared full block except the first sight of each group.
    expected = (3000 - 5) * (520 // 16) * 16 / (3000 * 1000)
    stats = workload_stats(trace.load(write(tmp_path / "t.rpt", spec)))
    assert stats["prefix_reuse"] == pytest.approx(expected)


def test_sessions_extend_the_previous_turn() -> None:
    spec = SynthSpec(
        requests=4000, rate_rps=50, sessions_share=0.5, prefix_groups=2, prefix_len_tokens=64, think_s=1,
        input_len=LengthDist.parse("uniform:20,300"), output_len=LengthDist.parse("uniform:10,200"),
    )  # fmt: skip
    shapes = list(generate(spec))
    sessions = defaultdict(list)
    for shape in shapes:
        if shape.session:
            sessions[shape.session].append(shape)
    in_sessions = sum(len(turns) for turns in sessions.values())
    assert in_sessions / len(shapes) == pytest.approx(0.5, abs=0.03)
    multi = [turns for turns in sessions.values() if len(turns) > 1]
    assert len(multi) > 50 and max(len(t) for t in multi) <= 6
    for turns in sessions.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        for previous, current in zip(turns, turns[1:], strict=False):
            assert current.offset_ns >= previous.offset_ns + 10**9  # answer time and a pause first
            assert current.input_tokens > previous.input_tokens + previous.output_tokens
            assert current.prefix_hashes[: len(previous.prefix_hashes)] == previous.prefix_hashes
            assert current.roles == previous.roles + "au"
    assert all(s.turn == 0 and s.roles == "su" for s in shapes if not s.session)


def test_hashes_are_prefix_block_hashes_of_pseudo_token_ids() -> None:
    spec = SynthSpec(requests=50, input_len=LengthDist.parse("fixed:40"))
    for shape in generate(spec):
        assert len(shape.prefix_hashes) == 2 and shape.prefix_units == 40
    # Requests without a shared prefix hash fresh ids: block 0 of request i is ids i*stride...
    first = next(generate(spec))
    assert first.prefix_hashes == prefix_block_hashes(list(range(40)), 16, spec.key)


def test_endpoint_stream_share_and_model() -> None:
    spec = SynthSpec(
        requests=4000,
        endpoint="completions",
        stream_share=0.25,
        model="m1",
        input_len=LengthDist.parse("fixed:1"),
    )
    shapes = list(generate(spec))
    assert {(s.endpoint, s.roles, s.model) for s in shapes} == {("completions", "", "m1")}
    assert sum(s.stream for s in shapes) / len(shapes) == pytest.approx(0.25, abs=0.03)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("normal:1", "unknown distribution 'normal'"),
        ("fixed:0", "1 <= low <= high"),
        ("uniform:5", "bad length distribution"),
        ("uniform:9,3", "1 <= low <= high"),
        ("lognormal:sigma=1", "mean required"),
        ("lognormal:mean=0", "mean >= 1"),
    ],
)
def test_bad_distributions_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LengthDist.parse(text)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"requests": 5, "duration_s": 1.0}, "not both"),
        ({"rate_rps": 0}, "must be positive"),
        ({"sessions_share": 1.5}, "sessions-share must be between 0 and 1"),
        ({"prefix_groups": 2}, "positive --prefix-len"),
        ({"endpoint": "embeddings"}, "chat or completions"),
    ],
)
def test_bad_specs_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SynthSpec(**options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poisson or gamma:CV"):
        parse_arrival("gamma:zero")
