"""Result files (.rpr): round trip, side records, damage and version checks (replayproxy/results.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayproxy import results, trace
from replayproxy.results import RESULT_FIELDS, ReplayResult, ResultWriter, RunHeader, load_results
from replayproxy.trace import ReadReport, TraceFormatError
from replayproxy.trace.column_file import read_column_file

I64 = st.integers(-(2**63), 2**63 - 1)
U32 = st.integers(0, 2**32 - 1)
replay_results = st.builds(
    ReplayResult,
    index=I64,
    scheduled_ns=I64,
    sent_ns=I64,
    endpoint=st.sampled_from(["chat", "completions"]),
    stream=st.booleans(),
    headers_ns=I64,
    ttft_ns=I64,
    e2e_ns=I64,
    chunk_gaps_us=st.lists(U32, max_size=5).map(tuple),
    chunk_tokens=st.lists(U32, max_size=5).map(tuple),
    content_chunks=I64,
    status=I64,
    error=st.sampled_from(["", "timeout", "http_5xx"]),
    error_message=st.text(max_size=20),
    expected_input_tokens=I64,
    expected_output_tokens=I64,
    prompt_tokens=I64,
    completion_tokens=I64,
    cached_tokens=I64,
    new_connection=st.booleans(),
    worker=I64,
)
HEADER = RunHeader(
    label="vllm-a",
    target="http://127.0.0.1:9",
    start_wall_ns=1_700_000_000 * 10**9,
    trace_paths=("a.rpt",),
    models={"data": [{"id": "m"}]},
    options={"speed": 2.0},
    replayproxy_version="0.1",
    shard="1/2",
    repetition=2,
    repetitions=3,
    warmup={"requests": 5, "errors": 0, "spec": "5"},
    contract={"engine_args": "--kv-cache-dtype fp8", "note": "canary", "max_model_len": 4096},
)


def row_of(loaded: results.ResultFile, i: int) -> dict[str, object]:
    values: dict[str, object] = {}
    for name in RESULT_FIELDS:
        if name in ("chunk_gaps_us", "chunk_tokens"):
            flat, index = loaded.ragged(name)
            values[name] = tuple(flat[index[i] : index[i + 1]].tolist())
        else:
            value = loaded.column(name)[i]
            values[name] = value.item() if hasattr(value, "item") else value
    return values


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(replay_results, max_size=10), st.integers(1, 4))
def test_every_result_field_round_trips(
    tmp_path: Path, written: list[ReplayResult], frame_records: int
) -> None:
    path = tmp_path / "run.rpr"
    with ResultWriter(path, HEADER, frame_records=frame_records) as writer:
        for result in written:
            writer.write(result)
    (loaded,) = load_results([path])
    assert len(loaded) == len(written) and loaded.header == HEADER
    for i, result in enumerate(written):
        assert row_of(loaded, i) == {name: getattr(result, name) for name in RESULT_FIELDS}


def test_side_records_and_footer_are_kept(tmp_path: Path) -> None:
    writer = ResultWriter(tmp_path / "run.rpr", HEADER, frame_records=2)
    writer.write(ReplayResult(index=0, scheduled_ns=0, sent_ns=1))
    writer.write_extra("telemetry", {"t_ns": 5, "running": 3})
    writer.write(ReplayResult(index=1, scheduled_ns=10, sent_ns=12))
    writer.write_extra("telemetry", {"t_ns": 9, "running": 4})
    writer.close(sent=2, schedule_lag_p99_ns=7)
    (loaded,) = load_results([tmp_path])
    assert loaded.column("index").tolist() == [0, 1]
    assert loaded.extras == {
        "telemetry": [
            {"type": "telemetry", "t_ns": 5, "running": 3},
            {"type": "telemetry", "t_ns": 9, "running": 4},
        ]
    }
    assert loaded.footer == {"type": "footer", "records": 2, "sent": 2, "schedule_lag_p99_ns": 7}


def test_truncated_result_file_keeps_complete_frames(tmp_path: Path) -> None:
    path = tmp_path / "run.rpr"
    with ResultWriter(path, HEADER, frame_records=2) as writer:
        for i in range(5):
            writer.write(ReplayResult(index=i, scheduled_ns=i, sent_ns=i))
    data = path.read_bytes()
    path.write_bytes(data[:-10])  # a crash while the footer frame was being written
    report = ReadReport()
    (loaded,) = load_results([path], report)
    assert loaded.column("index").tolist() == [0, 1, 2, 3, 4]
    assert loaded.footer == {} and report.footers == 0
    assert len(report.warnings) == 1 and "truncated last frame" in report.warnings[0]


def test_multiple_files_load_in_name_order(tmp_path: Path) -> None:
    for name, label in (("b.rpr", "second"), ("a.rpr", "first")):
        with ResultWriter(tmp_path / name, RunHeader(label=label, target="t", start_wall_ns=0)):
            pass
    assert [f.header.label for f in load_results([tmp_path])] == ["first", "second"]


def test_newer_result_version_and_traces_are_refused(tmp_path: Path) -> None:
    with ResultWriter(tmp_path / "run.rpr", HEADER):
        pass
    with pytest.raises(TraceFormatError, match="newer than this reader"):
        read_column_file(tmp_path / "run.rpr", results.FORMAT_NAME, 0, ReadReport())
    trace_path = tmp_path / "t.rpt"
    trace.write_trace(
        trace_path, trace.TraceHeader(start_wall_ns=0), [], mono_ns=lambda: 0, wall_ns=lambda: 0
    )
    with pytest.raises(TraceFormatError, match="expected 'replayproxy-result'"):
        load_results([trace_path])


# --------------------------------------------------------------------------- the golden file

GOLDEN = Path(__file__).parent / "data" / "result-v1-golden.rpr"
ADDED_SINCE_GOLDEN = ("prepared_late",)  # result fields newer than the golden file
HEADER_ADDED_SINCE_GOLDEN = ("clock",)  # header entries newer than the golden file (their default there)


def test_version_1_golden_result_file_keeps_loading_every_field() -> None:
    from tests.data.make_golden_result import EXTRAS, FOOTER, golden_header, golden_results

    report = ReadReport()
    (loaded,) = load_results([GOLDEN], report)
    assert report.warnings == [] and report.footers == 1 and report.frames == 1 + 2 + 2 + 1
    # written before `prepared_late` existed: the file lacks it, the reader fills its default
    assert loaded.table.header["version"] == 1
    assert loaded.table.header["fields"] == [f for f in RESULT_FIELDS if f not in ADDED_SINCE_GOLDEN]
    assert loaded.header == golden_header()
    # The header spelled out, so a change to the generator cannot silently move the goal posts.
    h = loaded.header
    assert (h.label, h.target, h.start_wall_ns) == (
        "vllm@golden",
        "http://127.0.0.1:8000",
        1_700_000_000 * 10**9,
    )
    assert h.trace_paths == ("traces/prod.rpt",) and h.trace_digest == "ab" * 32 and h.flavor == "vllm"
    assert h.models == {"object": "list", "data": [{"id": "llama-3-8b", "max_model_len": 8192}]}
    assert (h.engine_version, h.replayproxy_version, h.host, h.token_timing) == (
        "0.6.3",
        "golden",
        "bench-1",
        "token",
    )
    assert h.options == {"speed": 2.0, "seed": 7, "traces": ["traces/prod.rpt"]}
    assert h.pre_run == {"reset_prefix_cache": "ok"} and h.warmup == {"requests": 4}
    assert (h.shard, h.repetition, h.repetitions) == ("0/2", 2, 3)
    assert h.contract == {"engine_args": "--max-num-seqs 64", "note": "golden"}
    # Every field of every row.
    expected = {
        "index": [0, 2, 3],
        "scheduled_ns": [0, 500_000_000, 1_000_000_000],
        "sent_ns": [120_000, 500_300_000, 1_000_050_000],
        "endpoint": ["chat", "completions", "chat"],
        "stream": [True, False, True],
        "headers_ns": [9_000_000, 40_000_000, -1],
        "ttft_ns": [15_000_000, 41_000_000, -1],
        "e2e_ns": [95_000_000, 41_000_000, 3_000_000],
        "chunk_gaps_us": [(20_000, 2**32 - 1), (), ()],
        "chunk_tokens": [(1, 2, 3), (), ()],
        "content_chunks": [3, 1, 0],
        "status": [200, 200, 503],
        "error": ["", "", "http_5xx"],
        "error_message": ["", "", "Service Unavailable"],
        "expected_input_tokens": [1200, 40, -1],
        "expected_output_tokens": [6, 10, -1],
        "prompt_tokens": [1201, 40, -1],
        "completion_tokens": [6, 10, -1],
        "cached_tokens": [1024, -1, -1],
        "expected_shared_tokens": [1024, 0, 0],
        "new_connection": [True, False, False],
        "prepared_late": [False, False, False],
        "worker": [1, 0, 0],
        "session": [0xFEEDFACECAFEBEEF, 0, 0xFEEDFACECAFEBEEF],
        "turn": [0, 0, 1],
        "after": [-1, -1, 0],
        "think_ns": [-1, -1, 250_000_000],
    }
    assert set(expected) == set(RESULT_FIELDS)
    rows = [row_of(loaded, i) for i in range(len(loaded))]
    for name, values in expected.items():
        assert [row[name] for row in rows] == values, name
    assert rows == [{name: getattr(r, name) for name in RESULT_FIELDS} for r in golden_results()]
    assert loaded.extras == {kind: [{"type": kind, **record}] for kind, record in EXTRAS.items()}
    assert loaded.footer == {"type": "footer", "records": 3, **FOOTER}


def test_the_writer_still_writes_what_the_reader_reads_as_the_golden_file(tmp_path: Path) -> None:
    from tests.data.make_golden_result import write_golden

    write_golden(tmp_path / "again.rpr")
    (golden,) = load_results([GOLDEN])
    (again,) = load_results([tmp_path / "again.rpr"])
    assert again.header == golden.header

    def layout(header: dict[str, object]) -> dict[str, object]:  # without the fields added since
        fields = [f for f in header["fields"] if f not in ADDED_SINCE_GOLDEN]  # type: ignore[attr-defined]
        kinds = {f: k for f, k in header["kinds"].items() if f in fields}  # type: ignore[attr-defined]
        older = {k: v for k, v in header.items() if k not in HEADER_ADDED_SINCE_GOLDEN}
        return {**older, "fields": fields, "kinds": kinds}

    assert layout(again.table.header) == layout(golden.table.header)
    assert [row_of(again, i) for i in range(len(again))] == [row_of(golden, i) for i in range(len(golden))]
    for name in RESULT_FIELDS:  # the same dtypes too
        if name in golden.table.ragged:
            assert [a.dtype for a in again.ragged(name)] == [g.dtype for g in golden.ragged(name)], name
        else:
            assert again.column(name).dtype == golden.column(name).dtype, name
    assert again.extras == golden.extras and again.footer == golden.footer
    assert list(results.request_rows([again])) == list(results.request_rows([golden]))


# --------------------------------------------------------------------------- the header's types


def _written_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, object]) -> Path:
    """A result file whose header record is HEADER's with `change` applied, as another writer may have
    left it."""
    record = {**HEADER.to_record(), **change}
    monkeypatch.setattr(RunHeader, "to_record", lambda self: record)
    path = tmp_path / "run.rpr"
    with ResultWriter(path, HEADER) as writer:
        writer.write(ReplayResult(index=0, scheduled_ns=0, sent_ns=1))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"contract": {"max_model_len": "4k"}}, "'contract.max_model_len' is not of type int | None"),
        ({"contract": {"gpus": [{"name": 1, "memory_total": "", "driver": ""}]}}, "'contract.gpus[0].name'"),
        ({"contract": {"gpus": [{"name": "H100"}]}}, "header lacks 'contract.gpus[0].memory_total'"),
        ({"contract": ["engine_args"]}, "header's 'contract' is not of type RunContract"),
        ({"trace_paths": "a.rpt"}, "header's 'trace_paths' is not of type tuple[str, ...]"),
        ({"repetition": True}, "header's 'repetition' is not of type int"),
        ({"warmup": {"requests": 2.5}}, "header's 'warmup.requests' is not of type int"),
        ({"clock": {"reference": {"source": "target Date header"}}}, "lacks 'clock.reference.offset_ns'"),
    ],
)
def test_a_header_entry_of_the_wrong_type_names_the_entry_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, object], message: str
) -> None:
    path = _written_with(tmp_path, monkeypatch, change)
    with pytest.raises(TraceFormatError) as info:
        load_results([path])
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_the_contract_reads_typed_and_keeps_what_a_newer_writer_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = {"name": "H100", "memory_total": "81559 MiB", "driver": "550.54"}
    contract = {"max_model_len": None, "gpus": [gpu], "note": "n", "power_limit_w": 700}
    path = _written_with(tmp_path, monkeypatch, {"contract": contract})
    monkeypatch.undo()
    (loaded,) = load_results([path])
    assert loaded.header.contract == contract  # the unknown key kept, in the file's order
    assert loaded.header.to_record()["contract"] == contract  # written again as it was read


def test_a_float_entry_may_be_written_as_an_int(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    warmup = {"spec": "8", "requests": 8, "errors": 0, "duration_s": 2}
    path = _written_with(tmp_path, monkeypatch, {"warmup": warmup})
    (loaded,) = load_results([path])
    assert loaded.header.warmup == warmup
