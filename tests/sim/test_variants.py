"""The sim's variant knobs, each seen over HTTP on a real loopback server: one knob, one difference."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from replayproxy.sim.sampler import WORDS, OutputPlan
from replayproxy.sim.variants import batch_variant, with_template_variant
from tests.sim.conftest import RunningSim
from tests.sim.helpers import chat_body, post

StartSim = Callable[..., RunningSim]
GREEDY = {"temperature": 0, "seed": 7, "max_tokens": 40}


def _answer(sim: RunningSim, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = post(sim.url + "/v1/chat/completions", body)
    assert status == 200, answer
    return dict(answer)


def _text(answer: dict[str, Any]) -> str:
    return str(answer["choices"][0]["message"]["content"])


def test_same_settings_same_greedy_answer(start_sim: StartSim) -> None:
    a, b = start_sim(speed=50), start_sim(speed=50, seed=3)
    body = chat_body("Name three rivers.", **GREEDY)
    assert _text(_answer(a, body)) == _text(_answer(b, body)) == _text(_answer(a, body))


def test_template_variant_adds_tokens_per_message_and_nothing_else(start_sim: StartSim) -> None:
    plain, variant = start_sim(speed=50), start_sim(speed=50, chat_template_extra_tokens=3)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    body = {"messages": messages, **GREEDY}
    a, b = _answer(plain, body), _answer(variant, body)
    assert b["usage"]["prompt_tokens"] - a["usage"]["prompt_tokens"] == 2 * 3
    assert _text(a) == _text(b)


def test_output_seed_changes_greedy_text(start_sim: StartSim) -> None:
    a, b = start_sim(speed=50), start_sim(speed=50, output_seed=1)
    body = chat_body("Name three rivers.", **GREEDY)
    first, other = _answer(a, body), _answer(b, body)
    assert _text(first) != _text(other)
    assert first["usage"]["prompt_tokens"] == other["usage"]["prompt_tokens"]


def test_ignore_stop_runs_past_the_stop_string(start_sim: StartSim) -> None:
    a, b = start_sim(speed=50), start_sim(speed=50, ignore_stop=True)
    probe = _text(_answer(a, chat_body("Tell a story.", **{**GREEDY, "max_tokens": 60})))
    stop = probe.split()[5]  # a word the greedy answer is known to contain
    body = chat_body("Tell a story.", **{**GREEDY, "max_tokens": 60}, stop=[stop])
    honoured, ignored = _answer(a, body), _answer(b, body)
    assert stop not in _text(honoured) and honoured["choices"][0]["finish_reason"] == "stop"
    assert _text(ignored) == probe
    assert ignored["usage"]["completion_tokens"] > honoured["usage"]["completion_tokens"]


def test_ignore_response_format_answers_free_text(start_sim: StartSim) -> None:
    a, b = start_sim(speed=50), start_sim(speed=50, ignore_response_format=True)
    body = chat_body("Give JSON.", **GREEDY, response_format={"type": "json_object"})
    assert isinstance(orjson.loads(_text(_answer(a, body))), dict)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(_text(_answer(b, body)))


async def _concurrent(url: str, body: dict[str, Any], n: int) -> list[str]:
    async with aiohttp.ClientSession() as session:

        async def one() -> str:
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                return _text(await resp.json())

        return await asyncio.gather(*(one() for _ in range(n)))


def test_batch_variance_changes_answers_only_when_batched(start_sim: StartSim) -> None:
    steady, variant = start_sim(speed=5), start_sim(speed=5, batch_variance=True)
    body = chat_body("Tell a story.", **{**GREEDY, "max_tokens": 30, "ignore_eos": True})
    alone = [_text(_answer(variant, body)) for _ in range(3)]
    assert len(set(alone)) == 1 and alone[0] == _text(_answer(steady, body))
    batched = asyncio.run(_concurrent(variant.url, body, 6))
    assert len(set(batched)) > 1
    assert len(set(asyncio.run(_concurrent(steady.url, body, 6)))) == 1


def test_batch_variant_keeps_length_prefix_and_finish() -> None:
    ids = tuple(range(10**6, 10**6 + 21))
    plan = OutputPlan(tuple(f" w{i}" for i in range(20)) + ("",), "stop", None, ids=ids)
    changed = batch_variant(plan, random.Random(1), WORDS)
    assert changed.length == plan.length and changed.finish_reason == "stop" and changed.pieces[-1] == ""
    cut = next(i for i, (x, y) in enumerate(zip(plan.pieces, changed.pieces, strict=True)) if x != y)
    assert cut >= plan.length // 2
    assert changed.ids[:cut] == plan.ids[:cut] and changed.ids[cut] != plan.ids[cut]  # the cache sees it too
    shaped = OutputPlan(("{", "}", ""), "stop", None, shaped=True)
    assert batch_variant(shaped, random.Random(1), WORDS) is shaped


def test_template_variant_ids_only_for_chat() -> None:
    assert with_template_variant([1, 2], 0, 5) == [1, 2]
    assert len(with_template_variant([1, 2], 3, 2)) == 2 + 6
