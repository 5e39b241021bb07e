"""One record's bad values cost that record's values alone: never the batch, never the frame.

Arbitrary JSON bodies (huge and negative integers, floats, NaN, deep nesting, wrong types in every
field) and arbitrary usage answers go through shape extraction and the trace writer's encoding;
nothing raises, and every record of the batch reaches the file.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayproxy.clock import now_ns, wall_ns
from replayproxy.proxy.extract import build_shape
from replayproxy.proxy.observe import Capture
from replayproxy.proxy.prompt import PromptHasher
from replayproxy.shape import RequestShape
from replayproxy.trace import ReadReport, TraceHeader, TraceWriter, read_trace_files
from tests.proxy.helpers import add_piece
from tests.proxy.test_record_core import KEY, Core, cap

HASHER = PromptHasher(KEY)
REQUEST_KEYS = [
    "model", "messages", "prompt", "stream", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "n", "seed", "logprobs", "top_logprobs", "stop", "tools", "functions",
    "response_format", "tool_choice", "user", "logit_bias", "stream_options", "min_tokens",
]  # fmt: skip
EDGE_NUMBERS = st.sampled_from(
    [
        2**63,
        2**64 - 1,
        2**64,
        2**70,
        -(2**63) - 1,
        -(2**80),
        -1,
        0,
        math.nan,
        math.inf,
        -math.inf,
        1e308,
        -0.0,
    ]
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), EDGE_NUMBERS, st.floats(allow_nan=True), st.text(max_size=20)
)


def nested(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value, "type": "image"}
    return value


VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
MESSAGES = st.lists(
    st.one_of(
        VALUES,
        st.fixed_dictionaries(
            {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), VALUES)},
            optional={"content": VALUES, "name": VALUES, "tool_calls": VALUES},
        ),
    ),
    max_size=5,
)
BODIES = st.fixed_dictionaries(
    {}, optional={key: MESSAGES if key == "messages" else VALUES for key in REQUEST_KEYS}
)
USAGE = st.fixed_dictionaries(
    {}, optional={"prompt_tokens": VALUES, "completion_tokens": VALUES, "prompt_tokens_details": VALUES}
)


def safe_dumps(value: Any) -> bytes:
    """JSON bytes of `value`; {} for what JSON cannot hold (NaN, integers past 64 bits)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return b"{}"


def build(body: Any, usage: Any, endpoint: str, parsed: bool) -> RequestShape:
    """The shape of an exchange whose request is `body`: as bytes, or (`parsed`) as usage injection
    hands it over, which carries Python values no JSON parser gives (NaN, integers past 64 bits)."""
    raw = safe_dumps(body)
    c = Capture(arrival_ns=now_ns(), endpoint=endpoint, method="POST", path="/v1/x", request_body=[raw])
    c.request_json = body if parsed else None
    c.request_bytes = len(raw)
    c.status = 200
    add_piece(c, safe_dumps({"usage": usage}), now_ns())
    c.end_ns = now_ns()
    return build_shape(c, HASHER, 0)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bodies=st.lists(
        st.tuples(BODIES, USAGE, st.sampled_from(["chat", "completions"]), st.booleans()), max_size=6
    )
)
def test_arbitrary_bodies_build_and_encode_without_costing_other_records(
    bodies: list[tuple[Any, Any, str, bool]],
) -> None:
    good = [build({"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}, {}, "chat", False)
            for i in range(3)]  # fmt: skip
    odd = [build(*b) for b in bodies]  # nothing raises
    path = Path(tempfile.mkdtemp(prefix="isolation-")) / "t.rpt"
    unfit: dict[str, int] = {}
    header = TraceHeader(start_wall_ns=wall_ns())
    with TraceWriter(
        header, path=path, mono_ns=now_ns, wall_ns=wall_ns,
        count_unfit=lambda name, n: unfit.__setitem__(name, unfit.get(name, 0) + n),
    ) as writer:  # fmt: skip
        writer.write_many([good[0], *odd[: len(odd) // 2], good[1], *odd[len(odd) // 2 :], good[2]])
    report = ReadReport()
    [(_, table)] = read_trace_files([path], report)
    assert table.n == len(odd) + 3 and not report.warnings
    models = table.columns["model"].tolist()
    assert [models[0], models[1 + len(odd) // 2], models[-1]] == ["m", "m", "m"]
    shutil.rmtree(path.parent)


def test_values_that_do_not_fit_a_column_are_clamped_or_unknown_and_counted(tmp_path: Path) -> None:
    body = {
        "model": "m",
        "max_tokens": 2**64 + 5,
        "seed": 2**70,
        "temperature": math.nan,
        "messages": [{"role": "user", "content": "hi"}],
    }
    shape = build(body, {"prompt_tokens": 2**64}, "chat", parsed=True)
    odd = shape._replace(turn=math.nan, chunk_gaps_us=(-5, 2**40), model=["not", "text"])
    unfit: dict[str, int] = {}
    with TraceWriter(
        TraceHeader(start_wall_ns=wall_ns()), path=tmp_path / "t.rpt", mono_ns=now_ns, wall_ns=wall_ns,
        count_unfit=lambda name, n: unfit.__setitem__(name, unfit.get(name, 0) + n),
    ) as writer:  # fmt: skip
        writer.write_many([odd, shape._replace(max_tokens=7)])
    [(_, table)] = read_trace_files([tmp_path / "t.rpt"])
    assert table.n == 2
    assert table.columns["max_tokens"].tolist() == [2**63 - 1, 7]  # clamped to the column
    assert table.columns["turn"].tolist() == [0, 0]  # NaN is no turn: the default
    assert table.columns["model"].tolist() == ["", "m"]  # not a string: unknown
    for sampling in table.columns["sampling"]:  # the seed past 64 bits is left out, the rest kept
        assert list(sampling) == ["temperature"] and math.isnan(sampling["temperature"])
    flat, lengths = table.ragged["chunk_gaps_us"]
    assert flat.tolist() == [0, 2**32 - 1] and lengths.tolist() == [2, 0]
    assert unfit == {"max_tokens": 1, "sampling": 2, "turn": 1, "chunk_gaps_us": 1, "model": 1}


def test_one_oversized_max_tokens_costs_nobody_else(tmp_path: Path) -> None:
    """The reproduction: max_tokens 2**63 in one request of a batch of 121 used to fail the writer and
    drop all of them; now all are written and the one value is counted as clamped."""
    core = Core(tmp_path)
    captures = [cap(i) for i in range(120)]
    for bad in (2**63, 2**64 - 1):
        body = orjson.dumps({"model": "m", "max_tokens": bad, "messages": [{"role": "user", "content": "x"}]})
        odd = cap(0)
        odd.request_body, odd.request_bytes = [body], len(body)
        captures.insert(60, odd)
    core.record(*captures)  # one batch
    core.close()
    [(_, table)] = read_trace_files([tmp_path / "traces"])
    assert table.n == 122
    assert sorted(table.columns["max_tokens"].tolist())[-2:] == [2**63 - 1, 2**63 - 1]
    assert core.sample("replayproxy_records_written_total") == 122
    assert core.sample("replayproxy_records_dropped_total", reason="writer_error") == 0
    assert core.sample("replayproxy_values_clamped_total", field="max_tokens") == 2


@pytest.mark.parametrize("depth", [100, 1000, 5000])
def test_deep_nesting_in_every_place_a_body_may_nest(depth: int) -> None:
    deep = nested(depth)
    bodies = [
        {"messages": deep},
        {"messages": [{"role": "user", "content": [deep]}]},
        {"messages": [{"role": deep, "content": "x", "name": deep, "tool_calls": deep}]},
        {"tools": deep, "response_format": deep, "stop": deep, "seed": deep},
        {"prompt": [deep]},
    ]
    for body in bodies:
        for endpoint in ("chat", "completions"):
            for parsed in (False, True):
                build(body, deep, endpoint, parsed)  # nothing raises
