"""Which served model each recorded model is sent to, decided from the target's /v1/models answer.

A trace names the models production used (or `synth`); a candidate serves its own. Sending a name
the target does not serve makes every request fail, so the mapping is settled before the clock
starts: an explicit choice wins, a target that serves exactly one model gets it, and anything else
is refused with the served names listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from replayproxy.errors import BadOption


class ModelChoice(NamedTuple):
    model_map: dict[str, str]  # recorded name -> name sent
    note: str  # one line for the user when a model was substituted, else ""


def served_models(models: Any) -> list[str]:
    """The ids in an OpenAI `/v1/models` answer; [] when the target did not say."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return []
    return [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]


def choose(
    recorded: Iterable[str], model: str, model_map: Mapping[str, str], served: list[str]
) -> ModelChoice:
    """The model map to replay with; raises ValueError naming the served models when none fits."""
    mapping = dict(model_map)
    if not served:  # the target lists nothing: send what the trace and the options say
        return ModelChoice(mapping, "")
    listed = ", ".join(served)
    if model:
        if model not in served:
            raise BadOption(f"--model {model!r} is not served by the target; it serves: {listed}")
        return ModelChoice(mapping, "")
    missing = sorted({mapping.get(name, name) for name in recorded} - set(served) - {""})
    if not missing:
        return ModelChoice(mapping, "")
    if len(served) == 1:
        for name in recorded:
            if mapping.get(name, name) in missing:
                mapping[name] = served[0]
        note = (
            f"the trace's model {_names(missing)} is not served; using {served[0]!r}, "
            "the only model the target serves (--model chooses another)"
        )
        return ModelChoice(mapping, note)
    raise BadOption(
        f"the trace's model {_names(missing)} is not served by the target; it serves: {listed}; "
        "choose one with --model (or map names with model_map in [replay])"
    )


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)
