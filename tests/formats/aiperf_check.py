"""Run by an interpreter that has AIPerf installed: feed a Mooncake file to AIPerf's own code.

Each row goes through `MooncakeTrace.model_validate` (aiperf.dataset.loader.models) and then
`PromptGenerator._build_token_sequence` (aiperf.dataset.generator.prompt), the step that
materializes every hash id's tokens and raises ConfigurationError for a final block outside
(0, block] or an id seen at two sizes. A stand-in corpus replaces the tokenizer (no network).
Prints "ok <rows>" or the first error; exit status 1 on error.

    python tests/formats/aiperf_check.py FILE BLOCK_SIZE
"""

import json
import random
import sys
import types

from aiperf.dataset.generator.prompt import PromptGenerator
from aiperf.dataset.loader.models import MooncakeTrace


class _Rng:
    def __init__(self) -> None:
        self._random = random.Random(0)

    def reseed_for_hash_id(self, hash_id: int) -> None:
        self._random.seed(hash_id)

    def randrange(self, n: int) -> int:
        return self._random.randrange(n)


def main(path: str, block: int) -> int:
    generator = types.SimpleNamespace(
        _cache={},
        _hash_id_corpus_rng=_Rng(),
        _tokenized_corpus=list(range(50_000)),
        tokenizer=types.SimpleNamespace(block_separation_token_id=1),
        _sample_tokens=lambda n: [7] * n,
    )
    rows = 0
    with open(path) as stream:
        for number, line in enumerate(stream, 1):
            try:
                trace = MooncakeTrace.model_validate(json.loads(line))
                tokens = PromptGenerator._build_token_sequence(
                    generator, trace.input_length, trace.hash_ids, block
                )
                assert len(tokens) == trace.input_length, (len(tokens), trace.input_length)
            except Exception as e:  # report AIPerf's own error for this line
                print(f"line {number}: {type(e).__name__}: {e}")
                return 1
            rows += 1
    print(f"ok {rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
