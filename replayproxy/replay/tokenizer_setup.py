"""Before the clock: find the target's tokenizer, measure what exact prompts need, and check the result.

The tokenizer is the local one given with `--tokenizer`, else a local copy of the served one found
from the engine's answers (replay.tokenizer_discovery) that counts as the engine's tokenize
endpoint does on a few probes, else that endpoint itself (replay.tokenizer), whose calls during
the run (live replies) are counted as load production did not send; without either, prompts fall
back to calibrated words and the run records that its lengths are approximate. Token-id prompts
are checked against the target too: ids come from the measured alphabet (so they are in the
vocabulary), and a target that refuses them gets text prompts instead, said in one line.
Everything found goes into the result header.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import aiohttp
import numpy as np
import orjson

from replayproxy import trace
from replayproxy.errors import BadOption
from replayproxy.replay import flavors, prompt_parts, synth, tokenizer_discovery
from replayproxy.replay.calibrate import Prober
from replayproxy.replay.prepared import Prepared
from replayproxy.replay.tokenizer import Chat, Tokenizer, TokenizerError, engine_tokenizer

_log = logging.getLogger("replayproxy.replay")
VERIFY_MAX = 32  # prepared requests re-counted by the tokenizer after planning (exact by construction)
VERIFY_TOKENS = 200_000  # ...and at most this many prompt tokens among them


def chat_keys(cols: trace.Columns, rows: np.ndarray) -> list[tuple[tuple[str, ...], bool]]:
    """The (roles, tools) template keys of the chat requests at `rows`, most common first."""
    chat_rows = rows[cols.endpoint[rows] == "chat"] if len(rows) else rows
    keys = Counter(
        (synth.chat_roles(str(cols.roles[r])), bool(cols.has_tools[r])) for r in chat_rows.tolist()
    )
    return [key for key, _ in keys.most_common()]


async def find_tokenizer(
    path: str,
    chat_template: str,
    flavor: flavors.Flavor,
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    headers: Mapping[str, str],
) -> tuple[Tokenizer | None, str]:
    """The local tokenizer at `path`, or the engine's endpoint; (None, why) when there is neither."""
    if path:
        from replayproxy.replay.hf_tokenizer import LocalTokenizer

        return LocalTokenizer(path, chat_template or None), ""
    return await engine_tokenizer(flavor.name, session, url, model, headers)


class Chosen(NamedTuple):
    tokenizer: Tokenizer | None
    path: str  # the local tokenizer's path, given or found; "" for the engine's endpoint
    note: str  # where it came from, or why there is none


PROBES = (
    Chat(({"role": "user", "content": "hello"},)),
    Chat((
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "Hello, wörld! 12 + 30 = 42? ünïcode — “quotes”"},
        {"role": "assistant", "content": " spaced\n\tout\n\n answer "},
        {"role": "user", "content": "again, please"},
    )),
)  # fmt: skip
TEXT_PROBES = ("Hello, wörld! 12 + 30 = 42?", " the quick brown fox\n")


async def same_ids(local: Tokenizer, engine: Tokenizer) -> bool:
    """Whether `local` encodes the probes to the ids the engine's endpoint gives (one batch of calls)."""
    for special in (True, False):
        if await local.encode_text(TEXT_PROBES, special) != await engine.encode_text(TEXT_PROBES, special):
            return False
    return await local.encode_chat(PROBES) == await engine.encode_chat(PROBES)


async def choose_tokenizer(
    path: str,
    chat_template: str,
    flavor: flavors.Flavor,
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    headers: Mapping[str, str],
    models: Any,
) -> Chosen:
    """The run's tokenizer: `path`, else the served one found on this host (when it agrees with the
    engine's endpoint), else the endpoint; all before the clock."""
    if path:
        tokenizer, why = await find_tokenizer(path, chat_template, flavor, session, url, model, headers)
        return Chosen(tokenizer, path, "--tokenizer")
    engine, why = await engine_tokenizer(flavor.name, session, url, model, headers)
    found = await tokenizer_discovery.discover(session, url, models, headers)
    if found is None:
        return Chosen(engine, "", why or "the engine's tokenize endpoint (no local copy of it found)")
    from replayproxy.replay.hf_tokenizer import LocalTokenizer

    try:
        local = LocalTokenizer(found.path, chat_template or None)
        agrees = engine is None or await same_ids(local, engine)
    except TokenizerError as e:
        _log.warning("the served tokenizer %s (%s) cannot be used here: %s", found.path, found.source, e)
        return Chosen(engine, "", why or f"the engine's tokenize endpoint ({found.source}: {e})")
    if not agrees:
        _log.warning(
            "the tokenizer at %s (%s) counts otherwise than the engine; using its tokenize endpoint",
            found.path, found.source,
        )  # fmt: skip
        return Chosen(engine, "", f"the engine's tokenize endpoint ({found.source} counts otherwise)")
    return Chosen(local, found.path, f"found: {found.source}")


def require_exact(record: Mapping[str, Any], allowed: bool) -> None:
    """Stop when prompts cannot be exact, naming the cause and the fix, unless approximate is allowed."""
    if allowed:
        _log.warning("prompt lengths are approximate (%s): --allow-approximate", record.get("reason"))
        return
    raise BadOption(
        f"exact prompts cannot be built ({record.get('reason') or 'no tokenizer'}): give the target's "
        "tokenizer with --tokenizer (tokenizer.json, its directory or a .gguf), or pass "
        "--allow-approximate to replay with calibrated, approximate lengths"
    )


async def measure_book(
    tokenizer: Tokenizer, cols: trace.Columns, rows: np.ndarray
) -> tuple[prompt_parts.Book | None, dict[str, Any]]:
    """The book for exact planning, and what the result header says about it."""
    try:
        book = await prompt_parts.measure(tokenizer, chat_keys(cols, rows))
    except TokenizerError as e:
        _log.warning("exact prompts unavailable (%s); input lengths will be approximate", e)
        return None, {"tokenizer": tokenizer.name, "lengths": "approximate", "reason": str(e)}
    record: dict[str, Any] = {
        "tokenizer": tokenizer.name,
        "lengths": "exact",
        "alphabet_words": len(book.alphabet),
        "templates": len(book.chat),
    }
    if book.failed:
        record["templates_approximate"] = dict(book.failed)
        _log.warning("%d chat templates could not be measured exactly: %s", len(book.failed), book.failed)
    return book, record


async def token_ids_accepted(prober: Prober, ids: Sequence[int]) -> bool:
    """Does the target take `prompt: [ids]` on /v1/completions? (one token generated)"""
    body = {"model": prober.model, "prompt": list(ids), "max_tokens": 1, "stream": False}
    status, _ = await prober._post("/v1/completions", body)
    return status == 200


async def check_token_ids(
    prober: Prober, flavor: flavors.Flavor, book: prompt_parts.Book | None
) -> tuple[flavors.Flavor, dict[str, Any]]:
    """Keep token-id prompts only where the target takes ids from the vocabulary in use."""
    if not flavor.token_id_prompts:
        return flavor, {}
    ids = list(book.alphabet.ids[:4]) if book is not None else [synth.TOKEN_ID_LOW]
    highest = [max(book.alphabet.ids)] if book is not None else [synth.TOKEN_ID_HIGH - 1]
    if await token_ids_accepted(prober, ids) and await token_ids_accepted(prober, highest):
        return flavor, {"token_id_prompts": "accepted"}
    where = "exact text through the tokenizer" if book is not None else "calibrated text"
    _log.warning("the target refuses token-id prompts; completions are sent as %s", where)
    return replace(flavor, token_id_prompts=False), {"token_id_prompts": "refused: sent as text"}


def _chat_of(body: dict[str, Any]) -> Chat:
    return Chat(body["messages"], body.get("tools"))


async def verify(tokenizer: Tokenizer, prepared: Sequence[Prepared]) -> dict[str, Any]:
    """Re-count a spread of the prepared text prompts with the tokenizer: how many are exact."""
    candidates = [p for p in prepared if p.exact and p.expected_input_tokens > 0]
    if not candidates:
        return {"checked": 0, "exact": 0}
    picks = np.linspace(0, len(candidates) - 1, min(VERIFY_MAX, len(candidates))).round().astype(int)
    chosen, tokens = [], 0
    for i in sorted(set(picks.tolist())):
        if tokens > VERIFY_TOKENS:
            break
        chosen.append(candidates[i])
        tokens += candidates[i].expected_input_tokens
    bodies = [orjson.loads(p.body) for p in chosen]
    chats = [(p, _chat_of(b)) for p, b in zip(chosen, bodies, strict=True) if p.endpoint == "chat"]
    texts = [
        (p, b["prompt"])
        for p, b in zip(chosen, bodies, strict=True)
        if p.endpoint == "completions" and isinstance(b["prompt"], str)
    ]
    counts = [len(ids) for ids in await tokenizer.encode_chat([c for _, c in chats])]
    counts += [len(ids) for ids in await tokenizer.encode_text([t for _, t in texts])]
    ids_exact = [p for p, b in zip(chosen, bodies, strict=True) if isinstance(b.get("prompt"), list)]
    expected = [p.expected_input_tokens for p, _ in chats] + [p.expected_input_tokens for p, _ in texts]
    exact_count = sum(c == e for c, e in zip(counts, expected, strict=True))
    off = [c - e for c, e in zip(counts, expected, strict=True) if c != e]
    if off:
        _log.warning(
            "exact prompts: %d of %d re-counted prompts are off (by %s)", len(off), len(counts), off[:5]
        )
    return {"checked": len(counts) + len(ids_exact), "exact": exact_count + len(ids_exact)}
