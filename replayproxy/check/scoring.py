"""What one answer is worth, as numbers: a keyed hash, similarity, structured-output validity.

Similarity is rapidfuzz's normalized Indel similarity (1 − edits / total length, the ratio
difflib approximates), 0..1, computed in C++ so long answers cost little. Hashes are keyed with a
key drawn per check run and never stored: equal hashes inside one file mean equal answers, and a
short answer ("yes") cannot be recovered by hashing guesses.
"""

from __future__ import annotations

import hashlib
import secrets

import orjson
from rapidfuzz import fuzz

from replayproxy.check.client import Answer
from replayproxy.check.prompts import Prompt, validator

PPM = 1_000_000
NOT_APPLICABLE = -1


class Hasher:
    """Keyed 64-bit hashes of answers; one per run, so hashes compare only within one file."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def __call__(self, answer: Answer) -> str:
        return hashlib.blake2b(comparable_text(answer).encode(), key=self._key, digest_size=8).hexdigest()


def comparable_text(answer: Answer) -> str:
    """The answer as compared: its text, then each tool call as `name(arguments)` on a line."""
    calls = "".join(f"\n{call.name}({call.arguments})" for call in answer.tool_calls)
    return answer.text + calls


def similarity_ppm(a: str, b: str) -> int:
    """Normalized Indel similarity in parts per million (1e6: identical)."""
    return round(fuzz.ratio(a, b) / 100 * PPM)


def json_checks(prompt: Prompt, answer: Answer) -> tuple[int, int]:
    """(parses as JSON, validates against the request's schema), each 1/0 or NOT_APPLICABLE."""
    if prompt.structure not in ("json_object", "json_schema"):
        return NOT_APPLICABLE, NOT_APPLICABLE
    try:
        value = orjson.loads(answer.text)
    except orjson.JSONDecodeError:
        return 0, 0 if prompt.schema is not None else NOT_APPLICABLE
    parses = int(prompt.structure == "json_schema" or isinstance(value, dict))  # json_object: an object
    if prompt.schema is None:
        return parses, NOT_APPLICABLE
    return parses, int(validator(prompt.schema).is_valid(value))


def tool_check(prompt: Prompt, answer: Answer) -> int:
    """1 when every tool call parses and names a declared tool; 0 when one does not, or when the
    request forced a call and none came; NOT_APPLICABLE for a plain answer the request allowed."""
    if prompt.structure != "tools":
        return NOT_APPLICABLE
    if not answer.tool_calls:
        choice = prompt.body.get("tool_choice")
        return 0 if choice == "required" or isinstance(choice, dict) else NOT_APPLICABLE
    for call in answer.tool_calls:
        if call.name not in prompt.tool_names:
            return 0
        try:
            if not isinstance(orjson.loads(call.arguments or "{}"), dict):
                return 0
        except orjson.JSONDecodeError:
            return 0
    return 1


def reference_checks(prompt: Prompt, answer: Answer) -> tuple[int, int]:
    """(exact match after trimming whitespace, similarity ppm) to the reference answer."""
    if prompt.reference is None:
        return NOT_APPLICABLE, -1
    text = answer.text.strip()
    reference = prompt.reference.strip()
    return int(text == reference), similarity_ppm(text, reference)
