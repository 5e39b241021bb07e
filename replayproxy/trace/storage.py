"""Where trace, result and check files live: local paths, or object-store URLs read through fsspec.

Every command that reads these files names them the same way: a path, a directory, a glob, or a
URL (`s3://`, `gs://`, `az://`, `hf://`, `file://`, globs with `*` and `**` included). A remote
object is copied to an unlinked local temporary file a block at a time (memory stays at one
block) and then mapped like a local file; the next few objects download in the background while
one is decoded, so a fleet's segments arrive as fast as the store serves them. Credentials and
endpoints come from each store's standard environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL_S3,
GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_CONNECTION_STRING, HF_TOKEN, ...): never from a
flag, never written anywhere. The stores need the `storage` extra (fsspec and its back ends).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import logging
import mmap
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from replayproxy.errors import BadOption, FileAccessError, MissingFile, user_file

# scheme -> the fsspec back end's package, for the one line that says what to install
SCHEMES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "hf": "huggingface_hub",
    "file": "fsspec",
}
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_MAGIC = re.compile(r"[*?\[]")
_CHATTY = ("botocore", "aiobotocore", "s3fs", "fsspec", "gcsfs", "adlfs", "azure", "huggingface_hub")
BLOCK = 8 << 20  # bytes copied at a time from a remote object (and held in memory at most)
AHEAD = 4  # remote objects downloading while the one before them is read
SMALL = 1 << 20  # files below this are read into memory instead of mapped


def is_url(text: str | os.PathLike[str]) -> bool:
    return isinstance(text, str) and _URL.match(text) is not None


class _NamedByURL:
    """What reports and digests show of a remote source: its URL, and the name and suffix in it."""

    __slots__ = ()
    url: str

    def __str__(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix


@dataclass(eq=False, slots=True)
class ObjectURL(_NamedByURL):
    """A remote object named by its URL; `fetch` starts its download into a local spill file."""

    url: str
    size: int = -1
    _spill: Future[IO[bytes]] | None = field(default=None, repr=False)

    def fetch(self) -> None:
        """Start the download in the background (once); `opened` waits for it."""
        if self._spill is None:
            self._spill = _executor().submit(_download, self.url)

    def take(self) -> IO[bytes]:
        """The local spill file, downloaded; the caller owns (and closes) it."""
        self.fetch()
        assert self._spill is not None
        spill, self._spill = self._spill, None
        return spill.result()


@dataclass(frozen=True, slots=True)
class Spilled(_NamedByURL):
    """A remote object already downloaded to a local file: read from there, named by its URL
    (in reports and digests), so that several readers of one trace download it once."""

    url: str
    local: Path


Source = Path | ObjectURL | Spilled


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system serving `url` and the path within it; a store whose back end is not
    installed, or an unknown scheme, is one line naming what to do."""
    match = _URL.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme not in SCHEMES:
        raise BadOption(f"{url}: unknown storage scheme {scheme!r}; valid: {', '.join(sorted(SCHEMES))}")
    package = SCHEMES[scheme]
    for needed in ("fsspec", package):
        if importlib.util.find_spec(needed) is None:
            raise BadOption(f"{scheme}:// needs {needed}: pip install 'replayproxy[storage]'")
    import fsspec.core

    for name in _CHATTY:  # their INFO lines ("found credentials in ...") are noise on every command
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise BadOption(f"{_shown(url)}: {e}") from e
    return fs, path


def _shown(url: str) -> str:
    """A URL with any user:password part removed, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return parts._replace(netloc=host + (f":{parts.port}" if parts.port else "")).geturl()


Named = str | os.PathLike[str] | ObjectURL | Spilled  # what a command is given, or a found object


def expand(raws: Iterable[Named], suffix: str) -> list[Source]:
    """Files, directories (their *suffix files), globs and URLs, each group in name order; a URL
    naming a prefix (a "directory" of a store) takes every *suffix object under it, at any depth:
    a fleet's bucket is partitioned by date, hour and pod. Nothing found raises MissingFile."""
    found: list[Source] = []
    raws = list(raws)
    for raw in raws:
        if isinstance(raw, ObjectURL | Spilled):
            found.append(raw)
            continue
        text = os.fspath(raw)
        if is_url(text) and text.lower().startswith("file://"):
            text = urlsplit(text).path
        found.extend(_expand_url(text, suffix) if is_url(text) else _expand_local(text, suffix))
    if not found:
        raise MissingFile(f"no {suffix} files in {', '.join(map(str, raws))}")
    return found


def _expand_local(raw: str, suffix: str) -> list[Source]:
    path = Path(raw)
    if path.is_dir():
        return list(sorted(path.glob(f"*{suffix}")))
    if path.exists():
        return [path]
    matches = sorted(Path(m) for m in glob.glob(raw, recursive="**" in raw))
    if not matches:
        raise MissingFile(f"no such file: {raw}")
    return list(matches)


def _expand_url(url: str, suffix: str) -> list[Source]:
    fs, path = filesystem(url)
    protocol = url.split("://", 1)[0]
    with _store_errors(url):
        if _MAGIC.search(path):
            infos = fs.glob(path, detail=True)
            files = {name: info for name, info in infos.items() if info.get("type") != "directory"}
        elif fs.isfile(path):
            files = {path: fs.info(path)}
        else:
            files = {
                name: info
                for name, info in fs.find(path, detail=True).items()
                if name.endswith(suffix) and info.get("type") != "directory"
            }
    if not files:
        raise MissingFile(f"no such file: {_shown(url)}")
    return [ObjectURL(f"{protocol}://{name}", int(files[name].get("size") or -1)) for name in sorted(files)]


@contextlib.contextmanager
def _store_errors(url: str) -> Iterator[None]:
    """A store's refusal (no such bucket, no permission, unreachable) as one line, not a traceback."""
    try:
        yield
    except FileNotFoundError as e:
        raise MissingFile(f"no such file: {_shown(url)}") from e
    except PermissionError as e:
        raise FileAccessError(f"{_shown(url)}: permission denied ({type(e).__name__})") from e
    except OSError as e:
        raise FileAccessError(f"{_shown(url)}: {e.strerror or type(e).__name__}", e.errno) from e


def prefetch(sources: Sequence[Source], ahead: int = AHEAD) -> None:
    """Start downloading the first `ahead` remote objects of `sources` (the ones read next)."""
    for source in sources[:ahead]:
        if isinstance(source, ObjectURL):
            source.fetch()


@contextlib.contextmanager
def local_copies(raws: Iterable[Named], suffix: str) -> Iterator[list[Source]]:
    """`raws` expanded, each remote object downloaded once (AHEAD at a time) into a private
    temporary directory that the block's end removes: for several readers of one trace (a replay
    and its preparer process), which then read the local copies by path instead of each
    downloading the objects. Local files are passed as they are."""
    sources = expand(raws, suffix)
    with tempfile.TemporaryDirectory(prefix="replayproxy-copies-", ignore_cleanup_errors=True) as directory:
        copies: list[Source] = list(sources)
        pending = {
            at: (s.url, _executor().submit(_download, s.url, Path(directory) / f"{at:06d}{s.suffix}"))
            for at, s in enumerate(sources)
            if isinstance(s, ObjectURL)
        }
        try:
            for at, (url, download) in pending.items():
                with _store_errors(url), download.result() as copy:
                    copies[at] = Spilled(url, Path(copy.name))
        finally:
            for _, download in pending.values():
                download.cancel()
        yield copies


@contextlib.contextmanager
def opened(source: Source) -> Iterator[bytes | mmap.mmap]:
    """The file's bytes, memory-mapped when large so a big trace is not copied into the heap first.

    The map is closed on leaving, even on an error: an exception's traceback would otherwise keep
    it (and the file's pages) alive. Nothing read from it may view it past then.
    """
    stream: IO[bytes]
    if isinstance(source, Spilled):
        stream = open(source.local, "rb")  # noqa: SIM115 — closed below
    elif isinstance(source, ObjectURL):
        with _store_errors(source.url):
            stream = source.take()
    else:
        with user_file(source):
            stream = open(source, "rb")  # noqa: SIM115 — closed below
    with stream:
        size = os.fstat(stream.fileno()).st_size
        if size < SMALL:
            stream.seek(0)
            data: bytes | mmap.mmap = stream.read()
        else:
            data = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        yield data
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def read_bytes(source: Source) -> bytes:
    with opened(source) as data:
        return bytes(data)


_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(AHEAD, thread_name_prefix="replayproxy-fetch")
    return _pool


def _download(url: str, into: Path | None = None) -> IO[bytes]:
    """The object copied a block at a time into an unlinked temporary file, or the new file `into`."""
    fs, path = filesystem(url)
    spill = open(into, "xb") if into else tempfile.TemporaryFile(prefix="replayproxy-")  # noqa: SIM115
    try:
        with fs.open(path, "rb", block_size=BLOCK) as remote:
            shutil.copyfileobj(remote, spill, BLOCK)
        spill.flush()
    except BaseException:
        spill.close()
        raise
    return spill


def put(local: Path, url: str) -> None:
    """Copy a local file to `url` (results written by a replay pod, a rotated trace segment)."""
    fs, path = filesystem(url)
    with _store_errors(url):
        fs.put_file(str(local), path)


def staging_path(url: str) -> Path:
    """A local file to write what goes to `url` once complete (a new directory of its own)."""
    filesystem(url)  # an unknown store or a missing client is refused before anything is written
    name = url.rstrip("/").rsplit("/", 1)[-1]
    return Path(tempfile.mkdtemp(prefix="replayproxy-out-")) / name


def upload_staged(local: Path, url: str) -> None:
    """Upload a file written at `staging_path`, then remove it; on failure it stays, and the one
    line says where."""
    try:
        put(local, url)
    except (OSError, BadOption) as e:
        raise FileAccessError(f"{e}; the file is kept at {local}") from e
    local.unlink()
    with contextlib.suppress(OSError):
        local.parent.rmdir()


def join(prefix: str, *parts: str) -> str:
    """`prefix`/`parts`, one slash between each."""
    return "/".join([prefix.rstrip("/"), *(p.strip("/") for p in parts)])
