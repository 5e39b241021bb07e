"""Each candidate's contract from its run headers, and the warnings when two were not measured alike
(replayproxy/report/contracts.py)."""

from __future__ import annotations

from pathlib import Path

from replayproxy.report.contracts import cache_reset, contract_of, differences
from replayproxy.report.decision_types import ContractDoc, GpuDoc
from replayproxy.report.runs import load_runs
from replayproxy.results import ResultWriter, RunHeader
from tests.report.helpers import result

H100: GpuDoc = {"name": "H100", "memory_total": "80 GiB", "driver": "550"}


def _contract(
    label: str,
    *,
    model: str = "m",
    max_model_len: int | None = 4096,
    engine_config: dict[str, object] | None = None,
    gpus: list[GpuDoc] | None = None,
    prompt_lengths: str = "exact",
) -> ContractDoc:
    return {
        "label": label,
        "engine_version": "0.9",
        "model": model,
        "max_model_len": max_model_len,
        "engine_config": {"source": "/config", "kv_cache_dtype": "auto"}
        if engine_config is None
        else engine_config,
        "gpus": [H100] if gpus is None else gpus,
        "engine_args": "",
        "note": "",
        "warmup": {},
        "runs": 1,
        "cache_reset": "ok",
        "prompt_lengths": prompt_lengths,
    }


def test_the_contract_comes_from_the_first_runs_header(tmp_path: Path) -> None:
    header = RunHeader(
        label="A",
        target="http://a",
        trace_digest="d",
        start_wall_ns=1,
        engine_version="v0.9",
        warmup={"requests": 8},
        pre_run={"reset_prefix_cache": "ok"},
        contract={"max_model_len": 8192, "engine_args": "--enable-prefix-caching", "gpus": []},
    )
    with ResultWriter(tmp_path / "a.rpr", header) as writer:
        writer.write(result(0))
    (run,) = load_runs([tmp_path / "a.rpr"])
    contract = contract_of(run)
    assert contract["engine_version"] == "v0.9" and contract["max_model_len"] == 8192
    assert contract["engine_args"] == "--enable-prefix-caching" and contract["note"] == ""
    assert contract["engine_config"] == {} and contract["gpus"] == []
    assert contract["warmup"] == {"requests": 8} and contract["cache_reset"] == "ok" == cache_reset(run)


def test_a_run_without_a_reset_action_says_so(tmp_path: Path) -> None:
    header = RunHeader(label="B", target="http://b", trace_digest="d", start_wall_ns=1)
    with ResultWriter(tmp_path / "b.rpr", header) as writer:
        writer.write(result(0))
    (run,) = load_runs([tmp_path / "b.rpr"])
    assert cache_reset(run) == "no reset action"
    assert contract_of(run)["max_model_len"] is None


def test_differences_name_the_field_and_both_values() -> None:
    a = _contract("A")
    assert differences([a]) == [] and differences([a, _contract("B")]) == []
    b = _contract("B", model="other", engine_config={"kv_cache_dtype": "fp8"})
    assert differences([a, b]) == [
        "not a like-for-like comparison: A and B differ in model (m vs other)",
        "not a like-for-like comparison: A and B differ in kv_cache_dtype (auto vs fp8)",
    ]
    gpus = _contract("C", gpus=[{"name": "A100", "memory_total": "40 GiB", "driver": "550"}])
    assert differences([a, gpus]) == ["not a like-for-like comparison: A and C differ in GPUs (H100 vs A100)"]
    unknown = _contract("D", max_model_len=None, engine_config={}, gpus=[])
    assert differences([a, unknown]) == []  # what only one side knows is never a difference


def test_an_unknown_value_is_never_a_difference_between_llamacpp_and_vllm() -> None:
    vllm = _contract("vllm", engine_config={"source": "vllm:cache_config_info", "cache_dtype": "auto"})
    llamacpp = _contract(
        "llamacpp", engine_config={"source": "/props", "model_ftype": "BF16", "total_slots": 4}, gpus=[]
    )
    assert differences([vllm, llamacpp]) == []
    assert differences([llamacpp, vllm]) == []


def test_approximate_prompt_lengths_make_a_comparison_not_like_for_like(tmp_path: Path) -> None:
    header = RunHeader(
        label="A", target="http://a", trace_digest="d", start_wall_ns=1,
        pre_run={"prompts": {"lengths": "approximate", "reason": "no tokenize endpoint"}},
    )  # fmt: skip
    with ResultWriter(tmp_path / "a.rpr", header) as writer:
        writer.write(result(0))
    (run,) = load_runs([tmp_path / "a.rpr"])
    approximate = contract_of(run)
    assert approximate["prompt_lengths"] == "approximate: no tokenize endpoint"
    assert differences([_contract("B"), approximate | {"engine_config": {"kv_cache_dtype": "auto"}}]) == [
        "not a like-for-like comparison: A was replayed with approximate prompt lengths "
        "(no tokenize endpoint)"
    ]
