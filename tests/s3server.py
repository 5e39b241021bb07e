"""A real S3-compatible HTTP server on 127.0.0.1 (moto's standalone server) for object-storage tests.

It runs as its own process, in its own process group, always stopped: the code under test talks
to it over HTTP with its ordinary client (s3fs through fsspec), configured only by the standard
AWS environment variables, exactly as against a real bucket.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from replayproxy import children

# Credentials for the local server only; tests check that none of these ever reaches an output.
ACCESS_KEY = "AKIAFLEETTESTKEY0001"
SECRET_KEY = "fleet-test-secret-never-written-0001"


@dataclass(frozen=True, slots=True)
class S3:
    endpoint: str
    env: dict[str, str]  # the standard variables a process needs to reach the server

    def client(self) -> object:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)  # fmt: skip

    def make_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)  # type: ignore[attr-defined]

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)  # type: ignore[attr-defined]
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def s3_server(monkeypatch: pytest.MonkeyPatch | None = None, log: Path | None = None) -> Iterator[S3]:
    """moto's server on a free loopback port until the block ends; with `monkeypatch`, this
    process's environment points at it too (for commands run in-process); with `log`, its request
    log (one line per request: method, path, status) goes to that file (see `gets`)."""
    port = _free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    with (
        open(log or os.devnull, "wb") as requests,
        children.owned(argv, 0.0, stdout=subprocess.DEVNULL, stderr=requests) as process,
    ):
        deadline = time.perf_counter() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.perf_counter() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        if monkeypatch is not None:
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            _forget_filesystems()
        yield S3(endpoint, env)
    _forget_filesystems()


def _forget_filesystems() -> None:
    """fsspec caches file system instances (and their settings) per process: a new server needs new ones."""
    from fsspec.spec import AbstractFileSystem

    for cls in list(_subclasses(AbstractFileSystem)):
        with contextlib.suppress(Exception):
            cls.clear_instance_cache()


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def gets(log: Path, key: str) -> int:
    """How many GET requests the server logged (s3_server's `log`) for the object `key`."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())  # the log colours some statuses
    return len(re.findall(rf'"GET /{re.escape(key)}[ ?]', plain))


def environment(s3: S3) -> dict[str, str]:
    return {**os.environ, **s3.env}
