"""Live replies: the reply read back from raw response bytes, and the next turn sized through a real BPE."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from replayproxy.replay import prompt_parts, replies
from replayproxy.replay.hf_tokenizer import LocalTokenizer
from replayproxy.replay.prepared import Prepared
from replayproxy.replay.tokenizer import Chat


def _event(choice: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n"


def test_the_reply_comes_back_from_stream_reads_split_anywhere_and_from_whole_bodies() -> None:
    stream = (
        _event({"index": 0, "delta": {"role": "assistant", "content": ""}})
        + _event({"index": 0, "delta": {"reasoning_content": "hmm"}})  # not sent back by clients
        + _event({"index": 0, "delta": {"content": "Hello, "}, "token_ids": [5, 6]})
        + _event({"index": 0, "delta": {"content": "river!"}, "token_ids": [7]})
        + b"data: [DONE]\n\n"
    )
    reads = [(0, stream[:37]), (1, stream[37:101]), (2, stream[101:])]
    assert replies.reply_of(reads, stream=True) == replies.Reply("Hello, river!", [5, 6, 7], False)
    whole = orjson.dumps({"choices": [{"index": 0, "text": "a text", "token_ids": [1, 2]}]})
    assert replies.reply_of([(0, whole[:9]), (1, whole[9:])], stream=False) == replies.Reply(
        "a text", [1, 2], False
    )
    call = _event({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}})
    assert replies.reply_of([(0, call)], stream=True) == replies.Reply("", None, True)


def _prepared(
    index: int, endpoint: str, prompt: Any, expected_in: int, after: int = -1, out: int = 8
) -> Prepared:
    key = "messages" if endpoint == "chat" else "prompt"
    body = orjson.dumps({"model": "m", key: prompt})
    return Prepared(
        index=index, scheduled_ns=0, endpoint=endpoint, path="/v1/x", body=body, stream=False,
        expected_input_tokens=expected_in, expected_output_tokens=out, after=after, session=1,
    )  # fmt: skip


@pytest.fixture(scope="module")
def local(bpe_tokenizer: Path) -> tuple[LocalTokenizer, prompt_parts.Alphabet]:
    tokenizer = LocalTokenizer(bpe_tokenizer)
    return tokenizer, asyncio.run(prompt_parts.alphabet(tokenizer, prompt_parts.candidates()))


def _threader(local: tuple[LocalTokenizer, prompt_parts.Alphabet]) -> replies.Threader:
    tokenizer, letters = local
    setup = replies.Setup(letters.words, "", "", "vllm", "http://127.0.0.1:1", "m")
    return replies.Threader(setup, tokenizer, continued={0: 2, 1: 2})


def test_a_chat_turn_carries_the_reply_and_has_the_recorded_length(
    local: tuple[LocalTokenizer, prompt_parts.Alphabet],
) -> None:
    tokenizer, letters = local
    words = letters.words
    first = [
        {"role": "system", "content": " ".join(words[:30])},
        {"role": "user", "content": " ".join(words[30:50])},
    ]
    planned = [*first, {"role": "assistant", "content": " ".join(words[50:62])},
               {"role": "user", "content": " ".join(words[62:90])}]  # fmt: skip
    previous, turn = _prepared(0, "chat", first, 60), _prepared(1, "chat", planned, 140, after=0)
    threader = _threader(local)
    reply = replies.Reply("Well, rivers\nrun to the sea (mostly)!", None, False)
    body = orjson.loads(asyncio.run(threader.body_after(previous, reply, turn)) or b"{}")
    messages = body["messages"]
    assert messages[:3] == [*first, {"role": "assistant", "content": reply.text}]
    assert len(tokenizer.encode_chat_now([Chat(messages)])[0]) == 140
    assert threader.counts.built == 1 and threader.counts.short == 0
    # the turn after it starts from what was sent, not from the planned body
    later = [*planned, {"role": "assistant", "content": "x"}, {"role": "user", "content": words[0]}]
    again = asyncio.run(
        threader.body_after(turn, replies.Reply("ok", None, False), _prepared(2, "chat", later, 170, 1))
    )
    assert orjson.loads(again or b"{}")["messages"][:4] == messages
    second = _prepared(3, "chat", later, 170, after=1)
    other = asyncio.run(threader.body_after(turn, replies.Reply("no", None, False), second))
    assert orjson.loads(other or b"{}")["messages"][:4] == messages  # a second turn after it: the same
    # a reply longer than production's leaves too little room: one word, and counted
    short = asyncio.run(threader.body_after(previous, replies.Reply("word " * 200, None, False), turn))
    assert (
        orjson.loads(short or b"{}")["messages"][-1]["content"].count(" ") == 0 and threader.counts.short == 1
    )


@pytest.mark.parametrize("slot", ["assistant", "tool"])
def test_a_join_carries_every_joined_reply_where_its_context_had_them(
    local: tuple[LocalTokenizer, prompt_parts.Alphabet], slot: str
) -> None:
    """A join continuing branch 0 and joining branches 1 and 2: the parent's reply after its prompt,
    the joined replies in the assistant (quoted answers) or tool (tool results) messages after it,
    in order, and the other messages sized so the prompt keeps its recorded length."""
    tokenizer, letters = local
    words = letters.words
    first = [
        {"role": "system", "content": " ".join(words[:30])},
        {"role": "user", "content": " ".join(words[30:40])},
    ]
    said = lambda at, role="user": {"role": role, "content": " ".join(words[at : at + 6])}  # noqa: E731
    planned = [*first, said(50, "assistant"), said(60), said(70, slot), said(80), said(90, slot), said(100)]
    previous, turn = _prepared(0, "chat", first, 50), _prepared(3, "chat", planned, 180, after=0)
    turn = replace(turn, join_slots=(4, 6) if slot == "assistant" else (4, 6, 9))  # as the plan says
    threader = _threader(local)
    joined = ["Branch one found the river bend.", "Branch two: (mostly) dry!", "a third, past the end"]
    reply = replies.Reply("Branch zero says hello.", None, False)
    body = asyncio.run(threader.body_after(previous, reply, turn, joined))
    messages = orjson.loads(body or b"{}")["messages"]
    assert messages[:3] == [*first, {"role": "assistant", "content": reply.text}]
    assert [m["role"] for m in messages] == [m["role"] for m in planned]
    assert messages[4] == {"role": slot, "content": joined[0]}
    assert messages[6] == {"role": slot, "content": joined[1]}  # the third's slot is past the end: left out
    assert len(tokenizer.encode_chat_now([Chat(messages)])[0]) == 180
    # a joined request that failed (None) keeps its planned text in its slot
    kept = asyncio.run(threader.body_after(previous, reply, turn, [None, joined[0]]))
    kept_messages = orjson.loads(kept or b"{}")["messages"]
    assert kept_messages[4] == planned[4] and kept_messages[6]["content"] == joined[0]


def test_a_token_id_turn_appends_the_generated_ids() -> None:
    threader = replies.Threader(replies.Setup(("a",), "", "", "vllm", "", "m"), tokenizer=None)  # type: ignore[arg-type]
    previous = _prepared(0, "completions", [11, 12, 13], 3)
    turn = _prepared(1, "completions", [11, 12, 13, 40, 41, 42, 43, 44, 45, 46], 10, after=0)
    body = asyncio.run(threader.body_after(previous, replies.Reply("xy", [90, 91, 92], False), turn))
    prompt = orjson.loads(body or b"{}")["prompt"]
    assert (
        prompt[:6] == [11, 12, 13, 90, 91, 92] and len(prompt) == 10 and set(prompt[6:]) <= {40, 41, 42, 43}
    )
