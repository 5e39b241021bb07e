"""What the target says about itself, and the flavor's pre-run actions, all before the clock starts.

Uses aiohttp (convenience matters here, not microseconds). The answers go into the result header:
the /v1/models answer, the engine version where an endpoint exposes it, and each action's outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from replayproxy.config import API_KEY_SOURCES
from replayproxy.errors import TargetRefused, TargetUnreachable
from replayproxy.replay import probe_http
from replayproxy.replay.flavors import Action, Flavor
from replayproxy.replay.models import served_models

_log = logging.getLogger("replayproxy.replay")


@dataclass(frozen=True, slots=True)
class TargetInfo:
    models: Any  # the /v1/models answer as JSON, or None
    engine_version: str
    default_model: str  # the first served model, for requests without a recorded model


async def get_json(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> Any:
    try:
        status, raw = await probe_http.request(session, "GET", url, headers)
        return orjson.loads(raw) if status == 200 else None
    except (aiohttp.ClientError, orjson.JSONDecodeError, TimeoutError):
        return None


async def describe(
    session: aiohttp.ClientSession, url: str, flavor: Flavor, headers: Mapping[str, str]
) -> TargetInfo:
    """/v1/models and the engine version; a target that answers neither is refused (wrong URL)."""
    try:
        status, raw = await probe_http.request(session, "GET", f"{url}/v1/models", headers)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise TargetUnreachable(f"cannot reach target {url}: {e}") from e
    models = None
    if status == 200:
        try:
            models = orjson.loads(raw)
        except orjson.JSONDecodeError:
            models = None
    elif status in (401, 403):
        raise TargetRefused(
            f"target {url} answered {status} to GET /v1/models: give its API key ({API_KEY_SOURCES})"
        )
    version = ""
    for path in flavor.version_paths:
        answer = await get_json(session, f"{url}{path}", headers)
        if isinstance(answer, dict):
            found = answer.get("version") or answer.get("build_info")
            if found:
                version = str(found)
                break
    served = served_models(models)
    return TargetInfo(models, version, served[0] if served else "")


async def pre_run(
    session: aiohttp.ClientSession, url: str, flavor: Flavor, skip: set[str], headers: Mapping[str, str]
) -> dict[str, str]:
    """Run the flavor's pre-run actions not in `skip`; outcome per action ("ok", "skipped", "failed: ...").

    Also says whether the run starts from an emptied cache: `cache_start` is "cold" when a reset
    worked, else "cache-warm" (no reset action, skipped, or failed), which the report shows."""
    outcome: dict[str, str] = {}
    for action in flavor.pre_run:
        if action.name in skip:
            outcome[action.name] = "skipped"
            continue
        try:
            outcome[action.name] = await _act(session, url, action, headers)
        except (aiohttp.ClientError, TimeoutError) as e:
            outcome[action.name] = f"failed: {type(e).__name__}"
        if outcome[action.name] != "ok":
            _log.warning("pre-run action %s %s", action.name, outcome[action.name])
    cold = any(outcome.get(a.name) == "ok" for a in flavor.pre_run)
    outcome["cache_start"] = "cold" if cold else "cache-warm"
    return outcome


async def _act(session: aiohttp.ClientSession, url: str, action: Action, headers: Mapping[str, str]) -> str:
    """One action's outcome; a `{slot}` action is called for every slot, and fails at the first refusal."""
    slots = await slot_ids(session, url, headers) if "{slot}" in action.path else [0]
    if not slots:
        return "failed: no slots listed (GET /slots, /props total_slots)"
    for slot in slots:
        path = action.path.replace("{slot}", str(slot))
        status, _ = await probe_http.request(session, action.method, f"{url}{path}", headers)
        if status >= 300:
            return f"failed: HTTP {status}"
    return "ok"


async def slot_ids(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]) -> list[int]:
    """llama.cpp's slots: the ids `/slots` lists (served unless --no-slots), else `/props` total_slots."""
    listed = await get_json(session, f"{url}/slots", headers)
    if isinstance(listed, list):
        ids = [s["id"] for s in listed if isinstance(s, dict) and isinstance(s.get("id"), int)]
        if ids:
            return ids
    props = await get_json(session, f"{url}/props", headers)
    total = props.get("total_slots") if isinstance(props, dict) else None
    return list(range(total)) if isinstance(total, int) and 0 < total <= 4096 else []
