"""Background tasks of the sim that cannot vanish: a strong reference is kept, crashes are logged.

A copy of replayproxy.tasks in miniature, because the sim must not share code with what it tests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_log = logging.getLogger("replayproxy.sim")
_running: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start `coro`; the event loop keeps only weak references to tasks, so keep a strong one."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _running.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        _log.error("task %s crashed: %s: %s", task.get_name(), type(exc).__name__, exc)
