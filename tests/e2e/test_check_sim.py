"""`replayproxy check` against real simulated engines: equal sims agree, each knob is its own finding."""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from replayproxy.report.checks.report import check_documents
from replayproxy.results import load_checks
from replayproxy.trace import ReadReport
from replayproxy.trace.frames import iter_frame_payloads
from tests.cli import run_cli
from tests.servers import sim

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
SECRET = "zebra-quokka-secret"
# `stop: ["e"]` cuts the sim's answers early (most of its words contain an "e").
PROMPTS: list[dict[str, Any]] = [
    {"id": "plain-1", "messages": [{"role": "user", "content": f"Tell me about rivers {SECRET}."}]},
    {
        "id": "plain-2",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Describe a mountain."},
        ],
    },
    {"id": "stop-1", "messages": [{"role": "user", "content": "Tell a story."}], "stop": ["e"]},
    {"id": "stop-2", "messages": [{"role": "user", "content": "Tell another story."}], "stop": ["e"]},
    {
        "id": "json-object",
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "response_format": {"type": "json_object"},
    },
    {
        "id": "json-schema",
        "messages": [{"role": "user", "content": "Weather as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}},
    },
    {"id": "tool", "messages": [{"role": "user", "content": "Weather in Lima?"}], "tools": TOOLS},
    {"id": "completion", "prompt": "Once upon a time", "reference": "there was a king"},
]
SIM_OPTIONS = ("--speed", "20", "--mean-output-tokens", "1000")


def write_prompts(path: Path) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(p) for p in PROMPTS) + b"\n")
    return path


def check(targets: dict[str, str], out: Path, prompts: Path, *extra: str) -> dict[str, Any]:
    flags = [f for label, url in targets.items() for f in ("--target", f"{label}={url}")]
    done = run_cli("check", *flags, "--prompts", str(prompts), "-o", str(out), "--max-tokens", "48", *extra)
    assert done.returncode == 0, done.stderr
    (doc,) = check_documents([str(out)])
    return doc


def by_label(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["label"]: t for t in doc["targets"]}


def test_two_equal_sims_agree_fully(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    with sim(*SIM_OPTIONS) as a, sim(*SIM_OPTIONS, "--seed", "9") as b:
        doc = check({"A": a.url, "B": b.url}, tmp_path / "same.rpc", prompts)
    t = by_label(doc)["B"]
    assert t["match"] == 1.0 and t["similarity"] == 1.0 and t["compared"] == len(PROMPTS)
    assert t["prompt_tokens_equal"] == 1.0 and t["prompt_tokens_delta_mean"] == 0
    assert by_label(doc)["A"]["determinism"] == t["determinism"] == 1.0
    assert t["json_valid"] == t["schema_valid"] == t["tool_valid"] == 1.0
    assert doc["verdict"].startswith("B matches A on 100 % of 8 prompts; prompt tokens equal; every target")
    gate = run_cli("report", str(tmp_path / "same.rpc"), "--gate", "match>=0.95,determinism>=1")
    assert gate.returncode == 0 and "passed: match>=0.95" in gate.stdout


def test_each_knob_is_reported_as_its_own_difference(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    knobs = {
        "template": ("--chat-template-extra-tokens", "3"),
        "seed": ("--output-seed", "5"),
        "nostop": ("--ignore-stop",),
        "nojson": ("--ignore-response-format",),
        "batch": ("--batch-variance",),
    }
    with contextlib.ExitStack() as stack:
        urls = {"A": stack.enter_context(sim(*SIM_OPTIONS)).url}
        for label, options in knobs.items():
            urls[label] = stack.enter_context(sim(*SIM_OPTIONS, *options)).url
        out = tmp_path / "knobs.rpc"
        doc = check(urls, out, prompts, "--concurrency", "4", "--repeat", "3")
    t = by_label(doc)
    base = t["A"]
    assert base["determinism"] == 1.0 and base["json_valid"] == 1.0
    assert base["stop_prompts_ended_by_stop"] == 2

    # chat template: +3 tokens per message, answers unchanged
    assert t["template"]["prompt_tokens_delta_per_message"] == 3.0
    assert t["template"]["prompt_tokens_equal"] == pytest.approx(1 / 8)  # only the completion prompt
    assert t["template"]["match"] == 1.0 and t["template"]["determinism"] == 1.0
    # output seed: other text at temperature 0, same prompt tokens, still deterministic
    assert t["seed"]["match"] < 0.5 and t["seed"]["prompt_tokens_equal"] == 1.0
    assert t["seed"]["determinism"] == 1.0 and t["seed"]["json_valid"] == 1.0
    # stop ignored: the two `stop` prompts run on, everything else identical
    assert t["nostop"]["stop_prompts_ended_by_stop"] == 0
    assert t["nostop"]["stop_prompts_tokens_mean"] > base["stop_prompts_tokens_mean"]
    assert t["nostop"]["match"] == pytest.approx(6 / 8) and t["nostop"]["prompt_tokens_equal"] == 1.0
    # response_format ignored: JSON valid 100 % vs 0 %, tools unaffected
    assert t["nojson"]["json_valid"] == 0.0 and t["nojson"]["schema_valid"] == 0.0
    assert t["nojson"]["tool_valid"] == 1.0 and t["nojson"]["match"] == pytest.approx(6 / 8)
    # batch variance at concurrency 4: not deterministic, prompt tokens equal
    assert t["batch"]["determinism"] < 1.0 and t["batch"]["prompt_tokens_equal"] == 1.0
    assert t["batch"]["nondeterministic_prompts"]

    findings = doc["findings"]
    assert findings[0].startswith("PROMPT TOKENS DIFFER: template renders identical requests with 3 more")
    assert any(f.startswith("nostop finishes 0 of 2 prompts that carry `stop`") for f in findings)
    assert "JSON valid 0 % at nojson vs 100 % at A" in findings
    assert any(f.startswith("batch is not deterministic") for f in findings)
    template_findings = [f for f in findings[1:] if "template" in f]
    assert template_findings == ["template matches A on all 8 prompts both answered"]  # nothing else changed
    worst = t["seed"]["worst"]
    assert worst and all(w["similarity"] < 1 for w in worst) and "outputs" not in worst[0]

    failed = run_cli("report", str(out), "--gate", "match>=0.95")
    assert failed.returncode == 1
    assert "FAILED match>=0.95: seed" in failed.stdout and "template" not in failed.stdout.split("FAILED")[1]
    as_json = run_cli("report", str(out), "--json")
    assert orjson.loads(as_json.stdout)["checks"][0]["baseline"] == "A"


def test_default_result_keeps_no_text_and_keep_outputs_does(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    with sim(*SIM_OPTIONS) as a, sim(*SIM_OPTIONS, "--output-seed", "2") as b:
        private = tmp_path / "private.rpc"
        check({"A": a.url, "B": b.url}, private, prompts, "--repeat", "1")
        kept = tmp_path / "kept.rpc"
        doc = check({"A": a.url, "B": b.url}, kept, prompts, "--repeat", "1", "--keep-outputs")
    (loaded,) = load_checks([private])
    payloads = b"".join(map(bytes, iter_frame_payloads(private.read_bytes(), str(private), ReadReport())))
    assert SECRET.encode() not in payloads and b"Describe a mountain" not in payloads
    assert set(loaded.column("output")) == {""}
    (with_text,) = load_checks([kept])
    texts = [str(text) for text in with_text.column("output") if len(text) > 20]
    assert len(texts) >= len(PROMPTS) and not any(text.encode() in payloads for text in texts)
    assert by_label(doc)["B"]["worst"][0]["outputs"][1] in with_text.column("output")


def test_user_scorer_gets_each_answer(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    scorer = tmp_path / "score.py"
    scorer.write_text("import json, sys\nd = json.load(sys.stdin)\nprint(len(d['output']) % 7)\n")
    with sim(*SIM_OPTIONS) as a:
        score = ("--score", f"{sys.executable} {scorer}")
        doc = check({"A": a.url}, tmp_path / "scored.rpc", prompts, "--repeat", "1", *score)
    a_doc = by_label(doc)["A"]
    assert a_doc["scored_answers"] == len(PROMPTS) and a_doc["score"] is not None
    assert doc["scored"] is True


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"messages": [{"role": "user", "content": "hi"}]}\n{not json', "bad.jsonl:2: not a JSON object"),
        (b'{"messages": []}', "bad.jsonl:1: `messages` must be a non-empty list"),
        (b'{"prompt": "x", "messages": []}', "bad.jsonl:1: needs exactly one of"),
        (
            b'\n\n{"messages": [{"role": "user", "content": "x"}], "response_format": '
            b'{"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}',
            "bad.jsonl:3: `response_format.json_schema.schema` is not a valid schema",
        ),
    ],
)
def test_bad_prompt_file_is_one_line_with_file_and_line(tmp_path: Path, line: bytes, message: str) -> None:
    (tmp_path / "bad.jsonl").write_bytes(line)
    done = run_cli(
        "check",
        "--target",
        "A=http://127.0.0.1:9",
        "--prompts",
        str(tmp_path / "bad.jsonl"),
        "-o",
        str(tmp_path / "x.rpc"),
    )
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.rpc").exists()


def test_a_remote_schema_reference_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    """jsonschema would fetch a remote `$ref`; the check refuses it and connects nowhere."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        schema = {"type": "object", "properties": {"city": {"$ref": f"{url}/schema.json"}}}
        line = {
            "id": "remote",
            "messages": [{"role": "user", "content": "Weather as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
        }
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_bytes(orjson.dumps(line) + b"\n")
        done = run_cli(
            "check", "--target", f"A={url}", "--prompts", str(prompts), "-o", str(tmp_path / "x.rpc")
        )
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # no connection is waiting: neither the target nor the $ref
            listener.accept()
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert f"{prompts}:1: `response_format.json_schema.schema` refers to '{url}/schema.json'" in done.stderr
    assert not (tmp_path / "x.rpc").exists()
