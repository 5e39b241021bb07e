"""A stream the client read to its end is recorded as complete, however soon the client hangs up.

The openai SDK's sync client closes the response as soon as it reads `data: [DONE]`; the sim (like
uvicorn and llama.cpp) writes the chunked terminator separately after it. Completion is judged by
what the upstream sent and the proxy forwarded, so none of these turns may be a `client_cancel`,
and every conversation's turns must stay linked in one session.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.servers import sim, start_proxy
from tests.trace.helpers import shapes_of

pytestmark = pytest.mark.slow

MODEL = "sim-llama-3.1-8b"
CONVERSATIONS, TURNS = 40, 3


def converse(client: OpenAI, n: int) -> None:
    """One conversation, each turn the quickstart streaming loop, the reply sent back in the next."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"Conversation {n}."}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Question {turn} of {n}: why?"})
        stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, stream=True)  # type: ignore[arg-type]
        reply = ""
        for chunk in stream:
            reply += chunk.choices[0].delta.content or ""
        messages.append({"role": "assistant", "content": reply})


def test_streams_closed_after_done_are_complete_and_every_session_linked(tmp_path: Path) -> None:
    with sim("--speed", "50") as engine, start_proxy(engine.url, tmp_path) as proxy:
        client = OpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0)
        for n in range(CONVERSATIONS):  # one stream at a time
            converse(client, n)
        client.close()
        assert proxy.stop() == 0
    shapes = shapes_of(tmp_path)
    assert len(shapes) == CONVERSATIONS * TURNS
    assert Counter(s.error for s in shapes) == {"": CONVERSATIONS * TURNS}
    assert all(s.stream and s.output_tokens > 0 for s in shapes)
    sessions = Counter(s.session for s in shapes)
    assert len(sessions) == CONVERSATIONS and set(sessions.values()) == {TURNS}
    assert sorted(s.turn for s in shapes) == sorted(list(range(TURNS)) * CONVERSATIONS)
