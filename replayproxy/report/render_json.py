"""The report document as JSON (schema in docs/report.md): stable keys, units in names, null = unmeasured."""

from __future__ import annotations

import json
from collections.abc import Mapping

from replayproxy.report.document_types import Published


def render_json(doc: Mapping[str, object]) -> str:
    return json.dumps(doc, indent=2, allow_nan=False, default=_default) + "\n"


def _default(value: object) -> object:
    """Typed sections in their published layout; numpy scalars and sets that slipped into options
    become plain JSON values."""
    if isinstance(value, Published):
        return value.to_json()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, tuple | set):
        return list(value)
    return str(value)
