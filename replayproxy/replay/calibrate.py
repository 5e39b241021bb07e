"""Chat token calibration: how many tokens the target's template and our words really cost.

A chat prompt's token count is template overhead plus content; the template is the target's, so it
is measured, not assumed: a few non-streaming probes with `max_tokens` 1 read
`usage.prompt_tokens`, fit tokens per word and per-message overhead, and measure the exact
overhead of the most common role sequences. The fit is then checked on real planned requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import orjson

from replayproxy.config import API_KEY_SOURCES
from replayproxy.errors import UserError
from replayproxy.replay import flavors, probe_http, synth
from replayproxy.replay.prepared import Prepared

_log = logging.getLogger("replayproxy.replay")
SHORT_WORDS = 8
LONG_WORDS = 72
MAX_EXACT_KEYS = 12
VERIFY_REQUESTS = 4
PROBE_ATTEMPTS = 3


class CalibrationError(UserError, ValueError):
    """The target did not report usage, so exact lengths cannot be calibrated."""


@dataclass(slots=True)
class Prober:
    session: aiohttp.ClientSession
    url: str
    flavor: flavors.Flavor
    model: str
    headers: Mapping[str, str]
    probes: int = 0

    async def prompt_tokens(self, path: str, body: dict[str, Any]) -> int:
        """The target's `usage.prompt_tokens` for `body`; transient failures (429, 5xx) are retried."""
        for attempt in range(PROBE_ATTEMPTS):
            self.probes += 1
            status, raw = await self._post(path, body)
            try:
                usage = orjson.loads(raw).get("usage") or {}
            except (orjson.JSONDecodeError, AttributeError):
                usage = {}
            tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if status == 200 and isinstance(tokens, int):
                return tokens
            if not (status == 429 or status >= 500) or attempt == PROBE_ATTEMPTS - 1:
                break
            await asyncio.sleep(0.2 * (attempt + 1))
        raise CalibrationError(
            f"calibration probe {path} got HTTP {status}: {probe_failure(status, raw, path, self.model)}"
        )

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", **self.headers}
        try:
            return await probe_http.request(
                self.session, "POST", f"{self.url}{path}", headers, orjson.dumps(body)
            )
        except (aiohttp.ClientError, TimeoutError) as e:
            return 599, f"{type(e).__name__}: {e}".encode()

    async def chat(self, roles: Sequence[str], tools: bool, last_words: int) -> int:
        messages = [
            {"role": role, "content": _probe_words(i, last_words if i == len(roles) - 1 else 1)}
            for i, role in enumerate(roles)
        ]
        planned = flavors.Planned("chat", self.model, messages, False, 1, {}, tools, False)
        body = flavors.request_body(self.flavor, planned)
        return await self.prompt_tokens("/v1/chat/completions", _no_forcing(body))

    async def text(self, words: int) -> int:
        planned = flavors.Planned(
            "completions", self.model, _probe_words(0, words), False, 1, {}, False, False
        )
        return await self.prompt_tokens(
            "/v1/completions", _no_forcing(flavors.request_body(self.flavor, planned))
        )


def probe_failure(status: int, raw: bytes, path: str, model: str) -> str:
    """The likely cause of a failed probe, in the user's terms, with the server's own words after it."""
    said = " ".join(raw[:200].decode("utf-8", "replace").split())
    if status in (401, 403):
        cause = f"the target refused the request: give its API key ({API_KEY_SOURCES})"
    elif status in (400, 404) and model and model in said:
        cause = f"the target does not serve model {model!r}: choose one with --model"
    elif status in (404, 405):
        cause = f"the target has no {path}: --target must be the server's base URL (e.g. http://host:8000/v1)"
    elif status == 200:
        cause = "the answer has no usage.prompt_tokens; --no-calibrate skips calibration"
    else:
        cause = "--no-calibrate skips calibration"
    return f"{cause} (the target said: {said})" if said else cause


def _probe_words(salt: int, count: int) -> str:
    return " ".join(synth.VOCAB[(salt * 7 + i * 13) % len(synth.VOCAB)] for i in range(count))


def _no_forcing(body: dict[str, Any]) -> dict[str, Any]:
    """A probe generates one token: no ignore_eos / min_tokens beyond it."""
    body = {k: v for k, v in body.items() if k not in ("ignore_eos", "min_tokens", "stream_options")}
    body["max_tokens"] = 1
    body["stream"] = False
    return body


async def chat_template(
    prober: Prober, keys: Counter[tuple[tuple[str, ...], bool]]
) -> tuple[synth.Template, dict[str, Any]]:
    """Fit tokens per word and per message, and measure the most common keys exactly."""
    short = await prober.chat(("user",), False, SHORT_WORDS)
    long = await prober.chat(("user",), False, LONG_WORDS)
    per_word = (long - short) / (LONG_WORDS - SHORT_WORDS)
    if abs(per_word - 1.0) > 0.02:
        _log.warning(
            "calibration: %.3f tokens per word on this target; input lengths will be approximate", per_word
        )
    three = await prober.chat(("user", "assistant", "user"), False, SHORT_WORDS)
    per_message = round((three - short - 2 * per_word) / 2)
    fixed = round(short - SHORT_WORDS * per_word) - per_message
    exact: dict[str, int] = {}
    for (roles, tools), _ in keys.most_common(MAX_EXACT_KEYS):
        measured = await prober.chat(roles, tools, 1)
        exact[synth.template_key(roles, tools)] = round(measured - len(roles) * per_word)
    template = synth.Template(fixed, per_message, per_word, exact)
    report = {
        "tokens_per_word": round(per_word, 4),
        "fixed_tokens": fixed,
        "per_message_tokens": per_message,
        "exact_keys": len(exact),
    }
    return template, report


async def text_template(prober: Prober) -> tuple[synth.Template, dict[str, Any]]:
    """Completions with a text prompt: tokens per word and the fixed overhead (usually BOS)."""
    short = await prober.text(SHORT_WORDS)
    long = await prober.text(LONG_WORDS)
    per_word = (long - short) / (LONG_WORDS - SHORT_WORDS)
    fixed = round(short - SHORT_WORDS * per_word)
    return synth.Template(fixed, 0, per_word, {"completions": fixed}), {
        "tokens_per_word": round(per_word, 4),
        "fixed_tokens": fixed,
    }


async def verify(prober: Prober, prepared: Sequence[Prepared]) -> dict[str, int]:
    """Send a few planned requests (one token out) and count those whose prompt length is exact."""
    candidates = [p for p in prepared if p.expected_input_tokens > 0]
    if not candidates:
        return {"checked": 0, "exact": 0}
    picks = np.linspace(0, len(candidates) - 1, min(VERIFY_REQUESTS, len(candidates))).round().astype(int)
    exact = 0
    for i in sorted(set(picks.tolist())):
        p = candidates[i]
        body = _no_forcing(orjson.loads(p.body))
        got = await prober.prompt_tokens(p.path, body)
        exact += got == p.expected_input_tokens
        if got != p.expected_input_tokens:
            _log.warning(
                "calibration check: planned %d prompt tokens, target counted %d", p.expected_input_tokens, got
            )
    return {"checked": len(set(picks.tolist())), "exact": exact}
