"""`python -m replayproxy.sim` as a real subprocess: the listening line, options, config file, signals."""

import signal
import socket
import subprocess
import sys
from pathlib import Path

import orjson

from tests.servers import sim
from tests.sim.helpers import chat_body, get, post, read_truth


def test_subprocess_listens_on_an_ephemeral_port_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    truth = tmp_path / "truth.jsonl"
    with sim("--speed", "20", "--truth-log", str(truth), "--model", "m2") as server:
        assert server.output[0] == f"sim listening on {server.url}"
        status, answer = post(server.url + "/v1/chat/completions", {**chat_body(max_tokens=3), "model": "m2"})
        assert status == 200 and answer["model"] == "m2"
        assert read_truth(truth, 1)[0]["id"] == answer["id"]
        assert server.stop(signal.SIGTERM) == 0


def test_config_file_and_sigint(tmp_path: Path) -> None:
    config = tmp_path / "sim.toml"
    config.write_text('model = "from-toml"\nspeed = 10\n')
    with sim("--config", str(config)) as server:
        assert b"from-toml" in get(server.url + "/v1/models")[1]
        assert server.stop(signal.SIGINT) == 0


def test_bad_options_exit_2_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replayproxy.sim", "--fail-rate", "2"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "replayproxy sim: error: fail_rate must be within [0, 1], got 2.0"


def test_replayproxy_sim_help_is_the_sims_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replayproxy", "sim", "--help"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert "--tokens-per-chunk" in result.stdout and "--no-prefix-cache" in result.stdout


def _raw_stream_reads(url: str) -> list[bytes]:
    """Every recv() of one raw HTTP/1.1 streaming request (no client-side reassembly)."""
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps(chat_body(max_tokens=30, ignore_eos=True, stream=True))
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reads = []
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head + body)
        while data := conn.recv(65536):
            reads.append(data)
    return reads


def test_split_writes_reach_the_client_as_partial_events() -> None:
    with sim("--speed", "5", "--split-writes") as server:
        reads = _raw_stream_reads(server.url)
    # Each write is one HTTP chunk ending in "\r\n"; an event boundary is "\n\n\r\n".
    assert sum(not r.endswith(b"\n\n\r\n") for r in reads[1:]) > 0
    assert b"".join(reads).count(b"data: ") == 1 + 30 + 1


def test_a_busy_port_and_a_bad_value_are_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for argv, needle in (
            (["--port", str(port)], f"cannot listen on 127.0.0.1:{port}"),
            (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
            (["--speed", "nan"], "speed must be a finite number, got nan"),
        ):
            result = subprocess.run([sys.executable, "-m", "replayproxy.sim", *argv],
                                    capture_output=True, text=True, timeout=30)  # fmt: skip
            assert result.returncode == 2, result.stderr
            assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
