"""Run by an interpreter that has AIPerf installed: the input lengths AIPerf's multi-turn reading
of a Mooncake file sends, turn by turn.

Each row goes through AIPerf's `MooncakeTrace.model_validate`; rows are grouped by `session_id` in
file order, as its `MooncakeTraceDatasetLoader.load_dataset` does, into a `Conversation`; each
turn is advanced through AIPerf's own `UserSession` (aiperf.workers.session_manager, default
context mode `deltas_without_responses`), whose `turn_list` is what the request carries, and the
reply a server gives (`output_length` tokens) is stored back with `store_response`. A prompt of
n tokens is n words here (a stand-in tokenizer: no network). Prints one JSON list: the tokens each
row's request would carry, in file order; exit status 1 on error.

    python tests/formats/aiperf_multiturn_check.py FILE
"""

import json
import sys
import uuid
from collections import defaultdict

from aiperf.common.models import Conversation, Text, Turn
from aiperf.dataset.loader.models import MooncakeTrace
from aiperf.workers.session_manager import UserSession


def words(n: int) -> str:
    return " ".join(["w"] * n)


def tokens(turns: list) -> int:
    return sum(len(content.split()) for turn in turns for text in turn.texts for content in text.contents)


def main(path: str) -> int:
    sessions: dict[str, list[tuple[int, MooncakeTrace]]] = defaultdict(list)
    with open(path) as f:
        rows = [line for line in f if line.strip()]
    for position, line in enumerate(rows):
        trace = MooncakeTrace.model_validate_json(line)
        sessions[trace.session_id or str(uuid.uuid4())].append((position, trace))
    sent = [0] * len(rows)
    for session_id, traces in sessions.items():
        conversation = Conversation(session_id=session_id)
        for _, trace in traces:
            conversation.turns.append(
                Turn(
                    delay=trace.delay,
                    texts=[Text(name="text", contents=[words(trace.input_length)])],
                    max_tokens=trace.output_length,
                )
            )
        session = UserSession(x_correlation_id=session_id, num_turns=len(traces), conversation=conversation)
        for index, (position, trace) in enumerate(traces):
            session.advance_turn(index)
            sent[position] = tokens(session.turn_list)
            if session.should_store_response():
                session.store_response(
                    Turn(role="assistant", texts=[Text(contents=[words(trace.output_length or 0)])])
                )
    print(json.dumps(sent))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1]))
    except Exception as e:  # noqa: BLE001 — reported to the test, which shows it
        print(f"{type(e).__name__}: {e}")
        sys.exit(1)
