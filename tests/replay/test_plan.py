"""Planning: exact lengths and exact prefix sharing as the sim's tokenizer sees them, stable bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from replayproxy.replay import flavors, plan, synth
from replayproxy.replay.prepared import Prepared
from replayproxy.shape import RequestShape
from replayproxy.sim import tokenizer
from replayproxy.trace import load
from tests.replay import traces

SIM_TEMPLATE = synth.Template(tokenizer.CHAT_FIXED_OVERHEAD, tokenizer.CHAT_PER_MESSAGE_OVERHEAD, 1.0)
OPTIONS = plan.PlanOptions(chat_template=SIM_TEMPLATE)
VLLM = flavors.get("vllm")


def sim_prompt_ids(prepared: Prepared) -> list[int]:
    body = orjson.loads(prepared.body)
    if prepared.endpoint == "chat":
        return tokenizer.render_chat([(m["role"], m["content"]) for m in body["messages"]])
    prompt = body["prompt"]
    return prompt if isinstance(prompt, list) else [tokenizer.BOS_ID, *tokenizer.encode(prompt)]


def real_shared_blocks(prompts: list[list[int]], block: int) -> list[int]:
    """For each prompt, how many leading full blocks some earlier prompt has (what a prefix cache hits)."""
    seen: set[bytes] = set()
    shared = []
    for ids in prompts:
        keys = [np.array(ids[: block * (b + 1)], np.uint32).tobytes() for b in range(len(ids) // block)]
        shared.append(next((b for b, key in enumerate(keys) if key not in seen), len(keys)))
        seen.update(keys)
    return shared


def trace_shared_blocks(path: Path) -> list[int]:
    cols = load(path)
    owners = synth.first_owners(cols.prefix_hashes, cols.prefix_index)
    return [synth.shared_blocks(owners, cols.prefix_index, r) for r in range(len(cols))]


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return traces.write_synthetic(
        tmp_path_factory.mktemp("plan") / "chat.rpt",
        requests=300,
        prefix_groups=4,
        prefix_len_tokens=300,
        sessions_share=0.5,
        input_len="lognormal:mean=400,sigma=0.6",
        output_len="uniform:5,50",
    )


def test_chat_lengths_and_prefix_sharing_are_exact_on_the_sim_tokenizer(chat_trace: Path) -> None:
    cols = load(chat_trace)
    prepared = plan.prepare(cols, np.arange(len(cols)), VLLM, OPTIONS)
    prompts = [sim_prompt_ids(p) for p in prepared]
    assert [len(ids) for ids in prompts] == cols.input_tokens.tolist()
    assert real_shared_blocks(prompts, 16) == trace_shared_blocks(chat_trace)
    assert any(p.count(b'"role":"assistant"') for p in (x.body for x in prepared))  # multi-turn kept
    assert sum(trace_shared_blocks(chat_trace)) > 1000  # the trace really shares


def test_completion_token_ids_are_exact(tmp_path: Path) -> None:
    path = traces.write_synthetic(
        tmp_path / "c.rpt",
        endpoint="completions",
        requests=100,
        prefix_groups=2,
        prefix_len_tokens=160,
        sessions_share=0.3,
        input_len="uniform:50,400",
    )
    cols = load(path)
    prepared = plan.prepare(cols, np.arange(len(cols)), VLLM, OPTIONS)
    prompts = [sim_prompt_ids(p) for p in prepared]
    assert all(isinstance(orjson.loads(p.body)["prompt"], list) for p in prepared)
    assert [len(ids) for ids in prompts] == cols.input_tokens.tolist()
    assert real_shared_blocks(prompts, 16) == trace_shared_blocks(path)


def test_text_completions_for_flavors_without_token_ids(tmp_path: Path) -> None:
    path = traces.write(
        tmp_path / "t.rpt",
        [RequestShape(i * 1000, "completions", input_tokens=30 + i, output_tokens=5) for i in range(5)],
    )
    cols = load(path)
    prepared = plan.prepare(cols, np.arange(5), flavors.get("openai"), OPTIONS)
    assert all(isinstance(orjson.loads(p.body)["prompt"], str) for p in prepared)
    assert [len(sim_prompt_ids(p)) for p in prepared] == [30, 31, 32, 33, 34]  # BOS + words


def test_same_seed_same_bytes_other_seed_other_bytes(chat_trace: Path) -> None:
    cols = load(chat_trace)
    rows = np.arange(len(cols))
    first = [p.body for p in plan.prepare(cols, rows, VLLM, OPTIONS)]
    again = [p.body for p in plan.prepare(load(chat_trace), rows, VLLM, OPTIONS)]
    other = [
        p.body for p in plan.prepare(cols, rows, VLLM, plan.PlanOptions(seed=1, chat_template=SIM_TEMPLATE))
    ]
    assert first == again
    assert sum(a != b for a, b in zip(first, other, strict=True)) == len(first)


def test_window_does_not_change_a_requests_body(chat_trace: Path) -> None:
    """The tail words are keyed by trace index, so a request's bytes do not depend on the window."""
    cols = load(chat_trace)
    whole = plan.prepare(cols, np.arange(len(cols)), VLLM, OPTIONS)
    unshared = [p for p, s in zip(whole, trace_shared_blocks(chat_trace), strict=True) if s == 0]
    row = unshared[-1].index
    assert plan.prepare(cols, np.array([row]), VLLM, OPTIONS)[0].body == whole[row].body


def test_char_blocks_convert_with_the_trace_ratio(tmp_path: Path) -> None:
    shapes = [RequestShape(0, input_tokens=100, prefix_units=400, prefix_hashes=tuple(range(1, 7)))]
    cols = load(traces.write(tmp_path / "ch.rpt", shapes, block_size=64, unit="char"))
    assert plan.block_tokens(cols) == 16


def test_models_schedule_and_skipped_endpoints(tmp_path: Path) -> None:
    shapes = [
        RequestShape(0, "chat", model="a", input_tokens=40, output_tokens=3, roles="u"),
        RequestShape(1_000_000, "embeddings", model="a", input_tokens=40),
        RequestShape(3_000_000, "completions", model="", input_tokens=40, output_tokens=-1, max_tokens=9),
        RequestShape(5_000_000, "chat", model="b", input_tokens=40, output_tokens=0, roles="u", stream=False),
    ]
    cols = load(traces.write(tmp_path / "m.rpt", shapes))
    options = plan.PlanOptions(
        speed=2.0, model_map={"a": "A"}, default_model="served", chat_template=SIM_TEMPLATE
    )
    prepared = plan.prepare(cols, np.arange(4), VLLM, options)
    assert [p.index for p in prepared] == [0, 2, 3]  # embeddings are not replayed
    assert [p.scheduled_ns for p in prepared] == [0, 1_500_000, 2_500_000]
    bodies = [orjson.loads(p.body) for p in prepared]
    assert [b["model"] for b in bodies] == ["A", "served", "b"]
    assert [b["max_tokens"] for b in bodies] == [3, 9, 1]
    assert prepared[1].expected_output_tokens == -1  # the trace did not know it
    assert bodies[2]["stream"] is False and "stream_options" not in bodies[2]
    forced = plan.prepare(cols, np.arange(4), VLLM, plan.PlanOptions(model="X", chat_template=SIM_TEMPLATE))
    assert {orjson.loads(p.body)["model"] for p in forced} == {"X"}
