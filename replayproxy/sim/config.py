"""The simulated engine's settings: one frozen dataclass, filled from defaults < TOML file < CLI.

The argparse options are generated from the dataclass fields, so the CLI, the `--config` file and
the library API (`make_app(SimConfig(...))`) can never disagree about names or defaults.
"""

from __future__ import annotations

import argparse
import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# Engines whose OpenAI-compatible answers differ in bytes a proxy must keep (chunks/Formatter).
DIALECTS = ("vllm", "sglang", "llamacpp", "tgi", "trtllm", "openai")


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything that shapes the sim's behaviour; defaults resemble Llama-3.1-8B on one H100."""

    host: str = _opt("127.0.0.1", "address to listen on")
    port: int = _opt(8000, "port to listen on (0: an ephemeral port, printed on stdout)")
    model: str = _opt("sim-llama-3.1-8b", "served model name")
    max_model_len: int = _opt(8192, "context length limit (prompt + max_tokens), tokens")
    speed: float = _opt(1.0, "time scale: every modelled duration is divided by this")
    step_base_ms: float = _opt(6.0, "fixed cost of one engine step, ms")
    per_prefill_token_ms: float = _opt(0.05, "cost of each prefill token in a step, ms")
    per_decode_seq_ms: float = _opt(0.12, "cost of each decoding sequence in a step, ms")
    max_num_seqs: int = _opt(256, "most sequences running at once")
    max_num_batched_tokens: int = _opt(8192, "token budget of one step (chunked prefill)")
    num_gpu_blocks: int = _opt(28000, "KV cache size in blocks")
    block_size: int = _opt(16, "tokens per KV block")
    prefix_cache: bool = _opt(True, "reuse cached KV blocks of shared prompt prefixes")
    kv_cache_dtype: str = _opt("auto", "KV cache dtype reported in vllm:cache_config_info (a label only)")
    mean_output_tokens: float = _opt(256.0, "mean output length when EOS may end a request")
    seed: int = _opt(0, "seed of the output-length, text and fault draws")
    tokens_per_chunk: int = _opt(1, "generated tokens per SSE chunk")
    reasoning_tokens: int = _opt(0, "first N generated tokens of a chat reply stream as reasoning_content")
    split_writes: bool = _opt(False, "write every SSE event in two pieces (separate TCP writes)")
    truth_log: str | None = _opt(None, "append one JSON line of ground truth per request to this file")
    tokenizer: str | None = _opt(None, "Hugging Face tokenizer.json to count prompt tokens with")
    chat_template: str | None = _opt(None, "with --tokenizer: chatml or llama3 (default: detected)")
    fail_rate: float = _opt(0.0, "fraction of requests answered 500")
    throttle_rate: float = _opt(0.0, "fraction of requests answered 429")
    echo_reject_rate: float = _opt(0.0, "fraction of valid requests answered 400 quoting their body's start")
    reset_rate: float = _opt(0.0, "fraction of requests whose connection is reset mid-response")
    first_byte_delay: float = _opt(0.0, "extra wall-clock seconds before the first byte of a response")
    stall_rate: float = _opt(0.0, "fraction of streams that pause once mid-stream")
    stall_seconds: float = _opt(1.0, "length of a stall, wall-clock seconds")
    api_key: str = _opt("", "answer 401 on /v1/* without this bearer token, as vLLM --api-key does")
    chat_template_extra_tokens: int = _opt(0, "a chat-template variant: tokens it adds to every message")
    output_seed: int = _opt(0, "another model build: a different text for every prompt, greedy ones too")
    ignore_stop: bool = _opt(False, "ignore the requests' `stop` strings (a stop-handling bug)")
    ignore_response_format: bool = _opt(False, "answer free text even when `response_format` asks for JSON")
    batch_variance: bool = _opt(False, "greedy answers change when other requests share the batch")
    dialect: str = _opt("vllm", "wire format of answers: " + ", ".join(DIALECTS) + " (docs/sim.md)")
    run_noise: float = _opt(
        0.0, "run-to-run noise: each prefix-cache reset scales step costs by a seeded draw in [1-x, 1+x]"
    )
    close_after_stream: bool = _opt(
        False, "close the connection after each streamed response although it says keep-alive (llama.cpp)"
    )
    http_threads: int = _opt(
        0, "connections served at once; beyond them idle keep-alive ones are closed (llama.cpp); 0: no limit"
    )
    keepalive_timeout: float = _opt(75.0, "close a keep-alive connection idle this many seconds")
    slots: int = _opt(4, "dialect llamacpp: parallel slots listed on GET /slots (llama-server -np)")
    slot_save_path: str | None = _opt(
        None,
        "dialect llamacpp: as llama-server's --slot-save-path, POST /slots/N?action=erase works (else 501)",
    )

    def __post_init__(self) -> None:
        for f in fields(self):  # inf or NaN passes every comparison below in a way that breaks timers
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value}")
        positive = (
            "max_model_len",
            "speed",
            "max_num_seqs",
            "max_num_batched_tokens",
            "num_gpu_blocks",
            "block_size",
            "mean_output_tokens",
            "tokens_per_chunk",
            "slots",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in (
            "step_base_ms",
            "per_prefill_token_ms",
            "per_decode_seq_ms",
            "reasoning_tokens",
            "first_byte_delay",
            "stall_seconds",
            "chat_template_extra_tokens",
            "http_threads",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.keepalive_timeout > 0:
            raise ValueError(f"keepalive_timeout must be > 0, got {self.keepalive_timeout}")
        for name in ("fail_rate", "throttle_rate", "echo_reject_rate", "reset_rate", "stall_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(DIALECTS)}, got {self.dialect!r}")
        if not 0.0 <= self.run_noise < 1.0:
            raise ValueError(f"run_noise must be within [0, 1), got {self.run_noise}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be within [0, 65535], got {self.port}")
        if self.max_model_len > self.num_gpu_blocks * self.block_size:
            raise ValueError(
                f"max_model_len {self.max_model_len} does not fit in the KV cache "
                f"({self.num_gpu_blocks} blocks x {self.block_size} tokens); lower it or add blocks"
            )


_FIELDS = {f.name: f for f in fields(SimConfig)}
_OPTIONAL_STRINGS = ("truth_log", "tokenizer", "chat_template", "slot_save_path")


def _coerce(name: str, value: Any) -> Any:
    """Check a TOML value against the field's type (TOML ints are fine where floats are expected)."""
    default: Any = _FIELDS[name].default
    if name in _OPTIONAL_STRINGS:
        expected: tuple[type, ...] = (str,)
    elif isinstance(default, bool):
        expected = (bool,)
    elif isinstance(default, float):
        expected = (int, float)
    else:
        expected = (type(default),)
    matches = isinstance(value, expected) and (bool in expected or not isinstance(value, bool))
    if not matches:
        raise ValueError(f"config key {name!r} must be {expected[-1].__name__}, got {value!r}")
    return float(value) if float in expected else value


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file whose keys are the option names (dashes or underscores).

    In the config file every command shares, the sim's keys are its `[sim]` table and the other
    commands' tables are theirs; a file of the sim's keys alone works too.
    """
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: {e}") from e
    section = raw.get("sim")
    if isinstance(section, dict):
        raw = section
    else:
        raw = {key: value for key, value in raw.items() if not isinstance(value, dict)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in _FIELDS:
            raise ValueError(f"{path}: unknown key {key!r}; valid keys: {', '.join(sorted(_FIELDS))}")
        values[name] = _coerce(name, value)
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per SimConfig field; defaults stay None so a config file can fill the gaps."""
    parser.add_argument("--config", metavar="FILE", help="TOML file with the same keys as the options")
    for f in fields(SimConfig):
        flag = "--" + f.name.replace("_", "-")
        shown = "none" if f.default in ("", None) else f.default
        text = f"{f.metadata['help']} (default: {shown})"
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            kind = str if f.name in _OPTIONAL_STRINGS else type(f.default)
            parser.add_argument(flag, type=kind, default=None, metavar=f.name.upper(), help=text)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Merge defaults, the optional TOML file and the options actually given, in that order."""
    values = load_toml(args.config) if args.config else {}
    values.update({name: getattr(args, name) for name in _FIELDS if getattr(args, name) is not None})
    return replace(SimConfig(), **values)
