"""Kept prefix words: the bodies are the same whether a shared prefix was copied or built afresh."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from replayproxy import trace
from replayproxy.replay import flavors, plan, prefix_words, prompt_parts
from replayproxy.replay.hf_tokenizer import LocalTokenizer
from replayproxy.replay.tokenizer_setup import chat_keys
from tests.replay import traces


@pytest.mark.parametrize(
    ("endpoint", "flavor"), [("chat", "vllm"), ("completions", "vllm"), ("completions", "openai")]
)
def test_copied_prefixes_give_the_bodies_built_afresh(
    tmp_path: Path, bpe_tokenizer: Path, endpoint: str, flavor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = traces.prefix_heavy(tmp_path / "t.rpt", endpoint, requests=120, turns="uniform:2,4")
    cols = trace.load(path)
    rows = np.arange(len(cols))
    book = asyncio.run(prompt_parts.measure(LocalTokenizer(bpe_tokenizer), chat_keys(cols, rows)))
    options = plan.PlanOptions(book=book)
    found: list[bool] = []
    get = prefix_words.PrefixWords.get

    def counted(self: prefix_words.PrefixWords, at: prefix_words.Key) -> tuple[object, ...] | None:
        pieces = get(self, at)
        found.append(pieces is not None)
        return pieces

    monkeypatch.setattr(prefix_words.PrefixWords, "get", counted)
    copied = [p.body for p in plan.prepare(cols, rows, flavors.get(flavor), options)]
    assert sum(found) > len(rows) // 2  # most requests found their shared prefix kept
    monkeypatch.setattr(prefix_words.PrefixWords, "put", lambda *_: None)
    found.clear()
    fresh = [p.body for p in plan.prepare(cols, rows, flavors.get(flavor), options)]
    assert not any(found)
    assert copied == fresh


def test_the_oldest_prefixes_leave_first_when_the_budget_is_spent() -> None:
    kept = prefix_words.PrefixWords(max_bytes=100)
    kept.put(("a",), ("x" * 40,))
    kept.put(("b",), ("y" * 40,))
    kept.put(("c",), ([7],))  # a token id counts as 40 bytes: 120 in all, so the oldest goes
    assert kept.get(("a",)) is None
    assert kept.get(("b",)) == ("y" * 40,) and kept.get(("c",)) == ([7],)
    kept.put(("d",), ("z" * 101,))  # larger than the whole budget: not kept, nothing evicted for it
    assert kept.get(("d",)) is None and kept.get(("b",)) is not None
