"""Run by an interpreter that has AIPerf installed: AIPerf's own DAG loader on an exported file.

`DagJsonlLoader(path).load()` validates every line (`DagConversation`), desugars forks and spawns,
checks branch targets, `join_at` bounds and cycles, and runs AIPerf's orchestrator capability check.
Prints one JSON object: conversations, roots and turns it loaded; exit status 1 on error.

    python tests/formats/aiperf_dag_check.py FILE
"""

import json
import sys

from aiperf.dataset.loader.dag_jsonl import DagJsonlLoader


def main(path: str) -> int:
    loader = DagJsonlLoader(path)
    conversations = loader.load()
    turns = sum(len(c.turns) for c in conversations)
    print(
        json.dumps(
            {"conversations": len(conversations), "roots": len(loader.root_session_ids()), "turns": turns}
        )
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1]))
    except Exception as e:  # the check reports AIPerf's refusal in one line
        print(f"{type(e).__name__}: {e}")
        sys.exit(1)
