"""Two real engines compared as a user would: chat recorded through the proxy with the openai SDK,
the trace replayed against both (`compare`), the report side by side, and `check` across the two.

Opt-in: REPLAYPROXY_REAL_ENGINE=URL (vLLM, `../shared/real-engine/start.sh`; with
EXTRA_ARGS="--enable-prompt-tokens-details" its replies carry cached tokens) and
REPLAYPROXY_REAL_LLAMACPP=URL (`../shared/real-engine/llama.cpp/start.sh`, best with
EXTRA="--slot-save-path /tmp --cache-ram 0" for a cold start); skipped unless both answer. The
engines must serve the same model (the shared ones do: the same tiny Llama and tokenizer).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from replayproxy.report.checks.report import check_documents
from tests.cli import run_cli
from tests.servers import start_proxy
from tests.trace.helpers import shapes_of

pytestmark = [pytest.mark.slow, pytest.mark.serial]
ENGINES = {"A": "REPLAYPROXY_REAL_ENGINE", "B": "REPLAYPROXY_REAL_LLAMACPP"}
UNKNOWN = ("?", "None", "", "–", "null")


def _reachable(variable: str) -> str:
    url = os.environ.get(variable, "").rstrip("/").removesuffix("/v1")
    if not url:
        pytest.skip(f"opt-in: set {' and '.join(ENGINES.values())} to two running engines ({variable} unset)")
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as answer:
            answer.read()
    except OSError as e:
        pytest.skip(f"{variable}={url} does not answer /v1/models: {e}")
    return url


def chat_through_the_proxy(base: str, conversations: int = 8, turns: int = 3) -> None:
    """Multi-turn chat with the openai SDK: each turn carries the previous replies; every other
    turn streams with usage asked."""
    client = OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=2)
    model = client.models.list().data[0].id
    for n in range(conversations):
        system = f"You answer questions about topic {n % 3}. " + " ".join(
            f"fact{n % 3}-{i}" for i in range(60)
        )
        messages: list[Any] = [{"role": "system", "content": system}]
        for turn in range(turns):
            messages.append(
                {"role": "user", "content": f"Question {turn} of {n}: " + "why " * (10 + 7 * turn)}
            )
            ask = {"model": model, "messages": messages, "max_tokens": 12, "temperature": 0}
            if turn % 2:
                stream = client.chat.completions.create(
                    **ask, stream=True, stream_options={"include_usage": True}
                )
                reply = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            else:
                reply = client.chat.completions.create(**ask).choices[0].message.content or ""
            messages.append({"role": "assistant", "content": reply})
    client.close()


def no_warning_built_on_an_unknown(lines: list[str]) -> None:
    for line in lines:
        for a, b in re.findall(r"differ in \S+ \((.*?) vs (.*?)\)", line):
            assert a not in UNKNOWN and b not in UNKNOWN, line


@pytest.mark.timeout(900)
def test_record_once_replay_against_two_real_engines_report_and_check(tmp_path: Path) -> None:
    urls = {label: _reachable(variable) for label, variable in ENGINES.items()}
    traces, runs = tmp_path / "traces", tmp_path / "runs"
    with start_proxy(urls["A"], traces) as proxy:
        chat_through_the_proxy(proxy.url)
        assert proxy.stop() == 0
    recorded = shapes_of(traces)
    assert len(recorded) == 24 and all(s.status == 200 and s.input_tokens > 0 for s in recorded)
    trace_files = [str(p) for p in sorted(traces.rglob("*.rpt"))]

    targets = [f for label, url in urls.items() for f in ("--target", f"{label}={url}")]
    done = run_cli("compare", *trace_files, *targets, "--repeat", "2", "--warmup", "3", "-o", str(runs))
    assert done.returncode == 0, done.stderr
    report = run_cli("report", *(str(p) for p in sorted(runs.glob("*.rpr"))), "--json")
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)

    contracts = {c["label"]: c for c in doc["contracts"]}
    assert set(contracts) == {"A", "B"}
    for contract in contracts.values():  # both filled from what each engine publishes
        assert contract["engine_version"] and contract["model"], contract
        assert len(contract["engine_config"]) >= 3, contract
        assert contract["prompt_lengths"] == "exact", contract
    for run in doc["runs"]:
        assert run["errors"]["count"] == 0, run["errors"]
        assert run["exact_input_share"] >= 0.99 and run["exact_output_share"] == 1.0, run["label"]
        cache = run["prefix_cache"] or {}
        assert (cache.get("reply_cached_tokens") or 0) > 0 or (cache.get("engine_hit_tokens") or 0) > 0, (
            run["label"],
            cache,
        )
    verdict = doc["verdict"]
    assert verdict["lines"] and {c["label"] for c in verdict["candidates"]} == {"A", "B"}
    no_warning_built_on_an_unknown([*doc["warnings"], *verdict["warnings"]])
    text = run_cli("report", *(str(p) for p in sorted(runs.glob("*.rpr"))))
    assert text.returncode == 0 and "Verdict" in text.stdout

    out = tmp_path / "check.rpc"
    checked = run_cli(
        "check", *targets, "--builtin", "--repeat", "1", "--warmup", "0", "--max-tokens", "16", "-o", str(out)
    )
    assert checked.returncode == 0, checked.stderr
    (check,) = check_documents([str(out)])
    other = next(t for t in check["targets"] if t["label"] == "B")
    assert other["prompt_tokens_equal"] == 1.0, other  # one tokenizer, one chat template
