"""`replayproxy capacity` through the real CLI: text, JSON, workloads and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayproxy.capacity.loading import load_model, parse_memory_size
from replayproxy.capacity.memory import GIB
from replayproxy.results import ReplayResult, ResultWriter, RunHeader
from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_trace
from tests.cli import CliResult, run_cli

MS = 1_000_000


def cli(*args: str) -> CliResult:
    return run_cli("capacity", *args)


def test_text_report_for_a_preset() -> None:
    done = cli("--model", "llama-3.1-8b", "--gpu-memory", "80GiB")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "8.03 B parameters" in out
    assert "131,072 B per token" in out
    assert "80.00 GiB x 0.90 = 72.00 GiB per GPU: weights 14.96 / activations" in out
    assert "(max-model-len)" in out


def test_json_report_has_stable_keys_and_units() -> None:
    done = cli(
        "--model",
        "Qwen2.5-7B",
        "--gpu-memory",
        "24GiB",
        "--kv-dtype",
        "fp8",
        "--max-model-len",
        "32768",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["model"]["params_total"] == pytest.approx(7.62e9, rel=0.01)
    assert report["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 1
    assert report["setup"]["gpu_memory_bytes"] == 24 * GIB
    assert report["kv_tokens_per_replica"] == report["kv_blocks_per_replica"] * 16
    contexts = {c["context_tokens"]: c["sequences"] for c in report["contexts"]}
    assert contexts[32768] == report["kv_blocks_per_replica"] // 2048
    per_gpu = report["per_gpu"]
    used = (
        per_gpu["weights_bytes"]
        + per_gpu["activations_bytes"]
        + per_gpu["runtime_bytes"]
        + per_gpu["kv_bytes"]
    )
    assert used == per_gpu["budget_bytes"]
    assert report["trace"] is None


def test_weights_that_do_not_fit_exit_1_with_a_hint() -> None:
    done = cli("--model", "Llama-3.1-70B", "--gpu-memory", "80GiB")
    assert done.returncode == 1
    assert "DOES NOT FIT: the weights alone need 131.42 GiB per GPU" in done.stdout
    assert "try --tp 2" in done.stdout


def test_workload_that_overflows_the_cache(tmp_path: Path) -> None:
    # 40 requests of 120k input tokens at once: ~4.8M tokens, far beyond one 80 GiB GPU's cache.
    shapes = [
        RequestShape(
            offset_ns=i * MS, input_tokens=120_000, output_tokens=100, ttft_ns=2000 * MS, e2e_ns=5000 * MS
        )
        for i in range(40)
    ]
    path = tmp_path / "big.rpt"
    write_trace(path, TraceHeader(start_wall_ns=1), shapes, mono_ns=lambda: 0, wall_ns=lambda: 1)
    done = cli("--model", "Llama-3.1-8B", "--gpu-memory", "80GiB", "--json", str(path))
    assert done.returncode == 1, done.stderr
    trace = json.loads(done.stdout)["trace"]
    assert trace["requests"] == 40 and trace["peak_concurrent_requests"] == 40
    # Just before the first request ends at 5 s, request i has 1 + 99 x (3000 - i) / 3000 tokens out.
    expected = sum(120_000 + 1 + 99 * (3000 - i) / 3000 for i in range(40))
    assert trace["peak_resident_tokens"] == pytest.approx(expected)
    assert not trace["fits"] and trace["time_over_capacity_s"] > 1
    assert trace["smallest_util_for_peak"] > 1
    text = cli("--model", "Llama-3.1-8B", "--gpu-memory", "80GiB", str(path)).stdout
    assert "fits       NO" in text and "first at" in text
    assert "prefix-cache sharing is not counted" in text


def test_workload_that_fits(tmp_path: Path) -> None:
    shapes = [RequestShape(offset_ns=i * 100 * MS, input_tokens=1000, output_tokens=200) for i in range(40)]
    path = tmp_path / "small.rpt"
    write_trace(path, TraceHeader(start_wall_ns=1), shapes, mono_ns=lambda: 0, wall_ns=lambda: 1)
    done = cli(
        "--model", "Mistral-7B-v0.3", "--gpu-memory", "24GiB", "--assume-tpot-ms", "10", "--json", str(path)
    )
    assert done.returncode == 0, done.stderr
    trace = json.loads(done.stdout)["trace"]
    assert trace["fits"] and trace["estimated_requests"] == 40
    # 200 ms ttft + 199 x 10 ms decode = 2.19 s per request, one arriving every 100 ms: 22 in flight.
    assert trace["peak_concurrent_requests"] == 22
    assert 0 < trace["smallest_util_for_peak"] < 0.9
    assert trace["largest_max_model_len_tokens"] > 1200


def test_result_files_are_read(tmp_path: Path) -> None:
    header = RunHeader(label="run", target="http://127.0.0.1:1", start_wall_ns=1)
    with ResultWriter(tmp_path / "run.rpr", header) as writer:
        for i in range(10):
            writer.write(
                ReplayResult(
                    i,
                    i * 10 * MS,
                    i * 10 * MS,
                    ttft_ns=50 * MS,
                    e2e_ns=500 * MS,
                    prompt_tokens=3000,
                    completion_tokens=100,
                    chunk_gaps_us=(5000,) * 99,
                )
            )
    done = cli("--model", "Qwen2.5-7B", "--gpu-memory", "80GiB", "--json", str(tmp_path))
    assert done.returncode == 0, done.stderr
    trace = json.loads(done.stdout)["trace"]
    assert (
        trace["requests"] == 10 and trace["chunk_timed_requests"] == 10 and trace["estimated_requests"] == 0
    )
    assert trace["peak_concurrent_requests"] == 10
    assert trace["peak_resident_tokens"] == pytest.approx(10 * 3100, rel=0.01)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-9", "--gpu-memory", "80GiB"], "unknown model preset 'gpt-9'; valid: Llama-3.1-8B"),
        (["--model", "Llama-3.1-8B", "--gpu-memory", "eighty"], "bad memory size 'eighty'"),
        (["--model", "Llama-3.1-8B", "--gpu-memory", "80"], "needs a unit"),
        (["--model", "Llama-3.1-8B", "--gpu-memory", "80GiB", "--tp", "3"], "does not divide"),
        (["--model", "/nonexistent/config.json", "--gpu-memory", "80GiB"], "no such model config"),
        (["--model", "Llama-3.1-8B", "--gpu-memory", "80GiB", "--max-model-len", "0"], "at least 1"),
        (["--model", "Llama-3.1-8B", "--gpu-memory", "80GiB", "/nonexistent.rpt"], "no such file"),
    ],
)
def test_errors_are_one_line(args: list[str], message: str) -> None:
    done = cli(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replayproxy capacity: error:")
    assert message in lines[0]


def test_config_missing_keys_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    done = cli("--model", str(tmp_path), "--gpu-memory", "80GiB")
    assert done.returncode == 2
    assert "lacks num_hidden_layers, vocab_size" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_local_config_is_read(tmp_path: Path) -> None:
    config = {
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 2048,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(config))
    spec, source = load_model(str(tmp_path / "tiny"))
    assert spec.name == "tiny" and source.endswith("config.json") and spec.num_kv_heads == 2


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("80GiB", 80 * GIB),
        ("80G", 80 * GIB),
        ("24GB", 24 * 10**9),
        ("81559MiB", 81559 << 20),
        ("1.5 TiB", 3 << 39),
    ],
)
def test_parse_memory_size(text: str, size: int) -> None:
    assert parse_memory_size(text) == size
