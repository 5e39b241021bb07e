"""Every command in the README runs, in order, against the simulated engine — so the README cannot rot.

Commands are the `$ ` lines of the README's console blocks. Fixed ports and the example directory
are replaced by free ports and a temporary directory; a line ending in `&` starts a server that
runs until the test ends, and the next command waits until its port accepts connections.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = "/tmp/rp-readme"
EXAMPLE_PORTS = ("8000", "8080", "9464")


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```console\n(.*?)```", text, flags=re.S)
    return [line[2:].strip() for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port} after {timeout_s} s")


def test_readme_has_the_two_command_quickstart() -> None:
    text = (ROOT / "README.md").read_text()
    quickstart = re.search(r"## Quickstart\n\n```console\n(.*?)```", text, flags=re.S)
    assert quickstart is not None
    assert quickstart.group(1).split("\n")[:2] == ["make demo", "make test"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_readme_command_runs(tmp_path: Path) -> None:
    commands = readme_commands()
    assert len(commands) >= 10
    ports = {old: str(_free_port()) for old in EXAMPLE_PORTS}
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    background: list[subprocess.Popen[bytes]] = []
    try:
        for command in commands:
            for old, new in ports.items():
                command = command.replace(f":{old}", f":{new}").replace(f"--port {old}", f"--port {new}")
            command = command.replace(EXAMPLE_DIR, str(tmp_path))
            if command.endswith("&"):
                argv = shlex.split(command[:-1])
                background.append(
                    subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                )
                listen = re.search(r"(?:--listen \S+:|--port )(\d+)", command)
                assert listen is not None, f"background README command without a port: {command}"
                _wait_for_port(int(listen.group(1)))
                continue
            done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"README command failed: {command}\n{done.stdout}\n{done.stderr}"
    finally:
        for process in reversed(background):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
