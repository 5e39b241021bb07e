"""Exact prompts through a real BPE tokenizer: lengths and shared prefixes, request by request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import orjson
import pytest

from replayproxy import trace
from replayproxy.replay import flavors, plan, prompt_parts
from replayproxy.replay.hf_tokenizer import LocalTokenizer
from replayproxy.replay.prepared import Prepared
from replayproxy.replay.tokenizer import Chat
from replayproxy.replay.tokenizer_setup import chat_keys
from tests.replay import traces


def _book(tokenizer: LocalTokenizer, cols: trace.Columns) -> prompt_parts.Book:
    return asyncio.run(prompt_parts.measure(tokenizer, chat_keys(cols, np.arange(len(cols)))))


def _ids(tokenizer: LocalTokenizer, prepared: list[Prepared]) -> list[list[int]]:
    out = []
    for p in prepared:
        body = orjson.loads(p.body)
        if p.endpoint == "chat":
            out.append(tokenizer.encode_chat_now([Chat(body["messages"], body.get("tools"))])[0])
        elif isinstance(body["prompt"], list):
            out.append(body["prompt"])
        else:
            out.append(tokenizer.encode_text_now([body["prompt"]])[0])
    return out


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def _longest_shared(ids: list[list[int]], endpoints: list[str]) -> list[int]:
    """For each prompt, the longest prefix it shares with any earlier prompt of its endpoint."""
    return [
        max((_common(ids[i], ids[j]) for j in range(i) if endpoints[j] == endpoints[i]), default=0)
        for i in range(len(ids))
    ]


@pytest.mark.parametrize(
    ("endpoint", "flavor"), [("chat", "vllm"), ("completions", "vllm"), ("completions", "openai")]
)
def test_prefix_heavy_prompts_are_exact_in_length_and_sharing(
    tmp_path: Path, bpe_tokenizer: Path, endpoint: str, flavor: str
) -> None:
    """Chat with multi-turn sessions; completions as token ids (vllm) and as text (openai)."""
    path = traces.write_synthetic(
        tmp_path / "t.rpt",
        requests=160,
        prefix_groups=4,
        prefix_len_tokens=300,
        sessions_share=0.4 if endpoint == "chat" else 0.0,
        input_len="uniform:350,900",
        output_len="uniform:2,9",
        endpoint=endpoint,
    )
    cols = trace.load(path)
    block = plan.block_tokens(cols)
    tokenizer = LocalTokenizer(bpe_tokenizer)
    book = _book(tokenizer, cols)
    assert not book.failed
    prepared = plan.prepare(cols, np.arange(len(cols)), flavors.get(flavor), plan.PlanOptions(book=book))
    ids = _ids(tokenizer, prepared)
    assert [len(i) for i in ids] == [p.expected_input_tokens for p in prepared]
    shared = _longest_shared(ids, [p.endpoint for p in prepared])
    heads = {p.endpoint: 0 for p in prepared}
    heads["chat"] = len(next(iter(book.chat.values())).head) if book.chat else 0
    firsts = {p.endpoint: i for i, p in reversed(list(enumerate(prepared)))}
    expected = [
        max(p.expected_shared_tokens, heads[p.endpoint] if firsts[p.endpoint] != i else 0)
        for i, p in enumerate(prepared)
    ]
    # A later turn shares its previous turn whole, through the generation prompt: the trace's block
    # count ends a few tokens short of that, inside template tokens no prompt could diverge at.
    lengths = {len(i) for i in ids}
    whole_turn = [s in lengths and e < s < e + block for s, e in zip(shared, expected, strict=True)]
    exact = [s == e for s, e in zip(shared, expected, strict=True)]
    assert sum(p.expected_shared_tokens > 0 for p in prepared) > 60
    misses = [(s, e) for s, e, x, w in zip(shared, expected, exact, whole_turn, strict=True) if not (x or w)]
    assert np.mean(exact) + np.mean(whole_turn) >= 0.99, misses[:10]
    if endpoint == "completions":
        assert all(exact), misses[:10]
