"""Rotated trace files to object storage, partitioned by date, hour and pod.

A fleet's sidecars each write rotating files to a local directory; this uploads every closed one
to `PREFIX/date=YYYY-MM-DD/hour=HH/pod=NAME/<file>.rpt` (the hour the file was opened, UTC) and
removes the local copy once the store has it. It runs on a thread of the recorder process, so
neither forwarding nor trace writing ever waits on the network; a failed upload is retried with
exponential backoff (and jitter) and counted, the file staying on disk meanwhile, bounded by the
proxy's retention. Files left at shutdown are uploaded by the next start.
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from replayproxy.clock import now_ns
from replayproxy.trace import storage

MAX_BACKOFF_S = 60.0
_STAMP = re.compile(r"-(\d{8}T\d{6})Z-\d+\.rpt$")  # TraceWriter's names: PREFIX-<UTC time>-<seq>.rpt


def pod_name(configured: str = "") -> str:
    """The pod's name in upload paths: the setting, else $POD_NAME (the downward API), else
    $HOSTNAME (a pod's name by default), else the host name; made safe for a path segment."""
    name = configured or os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "pod"


def partition(path: Path) -> tuple[str, str]:
    """(date, hour) of the file, from the UTC time in its name, else its modification time."""
    match = _STAMP.search(path.name)
    if match:
        when = datetime.strptime(match.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    else:
        when = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return when.strftime("%Y-%m-%d"), when.strftime("%H")


def object_url(prefix: str, pod: str, path: Path) -> str:
    date, hour = partition(path)
    return storage.join(prefix, f"date={date}", f"hour={hour}", f"pod={pod}", path.name)


class SegmentUploader:
    """Uploads the closed files it is offered, oldest first, from a thread of its own.

    Counters (`uploaded`, `failures`, `lost`) are read and reset by the recorder's thread through
    `take_counts`; the upload thread only adds to them under the lock.
    """

    def __init__(
        self,
        prefix: str,
        pod: str,
        retry_s: float = 1.0,
        put: Callable[[Path, str], None] = storage.put,
    ) -> None:
        self._prefix = prefix
        self._pod = pod
        self._retry_ns = int(max(retry_s, 0.01) * 1e9)
        self._put = put
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop_at_ns: int | None = None
        self._pending: dict[Path, tuple[int, int]] = {}  # file -> (attempts so far, next attempt ns)
        self._counts = [0, 0, 0]  # uploaded, failed attempts, lost (gone before upload)
        self._errors: list[str] = []  # kinds of the last failures, for the recorder's rate-limited log
        self._thread = threading.Thread(target=self._run, name="replayproxy-upload", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, closed: Iterable[Path]) -> None:
        """Closed files to upload (files already waiting are left as they are)."""
        added = False
        with self._lock:
            for path in closed:
                if path not in self._pending:
                    self._pending[path] = (0, 0)
                    added = True
        if added:
            self._wake.set()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._pending)

    def take_counts(self) -> tuple[int, int, int, list[str]]:
        """(uploaded, failed attempts, lost, failure kinds) since the last call."""
        with self._lock:
            counts, errors = self._counts, self._errors
            self._counts, self._errors = [0, 0, 0], []
        return counts[0], counts[1], counts[2], errors

    def close(self, drain_s: float) -> None:
        """Keep uploading what waits for at most `drain_s`, then stop; what is left stays on disk."""
        if not self._thread.is_alive():
            return
        self._stop_at_ns = now_ns() + int(drain_s * 1e9)
        self._wake.set()
        self._thread.join(drain_s + 5.0)

    def _run(self) -> None:
        while True:
            due = self._next_due()
            stop_at = self._stop_at_ns
            if stop_at is not None and (due is None or now_ns() >= stop_at):
                return
            if due is None:
                self._wake.wait()
            elif due[1] > now_ns():
                until = due[1] if stop_at is None else min(due[1], stop_at)
                self._wake.wait(max(0.0, (until - now_ns()) / 1e9))
            else:
                self._upload(due[0])
            self._wake.clear()

    def _next_due(self) -> tuple[Path, int] | None:
        with self._lock:
            if not self._pending:
                return None
            path = min(self._pending, key=lambda p: (self._pending[p][1], p.name))
            return path, self._pending[path][1]

    def _upload(self, path: Path) -> None:
        if not path.exists():  # retention removed it first: the bound on local files wins
            with self._lock:
                self._pending.pop(path, None)
                self._counts[2] += 1
            return
        try:
            self._put(path, object_url(self._prefix, self._pod, path))
        except Exception as e:  # noqa: BLE001 — any failure is retried; the proxy never sees it
            with self._lock:
                attempts = self._pending.get(path, (0, 0))[0] + 1
                backoff = min(self._retry_ns * 2 ** min(attempts - 1, 30), int(MAX_BACKOFF_S * 1e9))
                self._pending[path] = (attempts, now_ns() + int(backoff * random.uniform(0.5, 1.0)))
                self._counts[1] += 1
                self._errors.append(type(e).__name__)
            return
        path.unlink(missing_ok=True)
        with self._lock:
            self._pending.pop(path, None)
            self._counts[0] += 1
