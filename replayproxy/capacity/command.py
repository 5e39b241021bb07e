"""`replayproxy capacity`: does a model fit a GPU, how much KV cache is left, and does a workload fit it.

Reads a local Hugging Face config.json or a preset (replayproxy.capacity.presets), computes
the memory plan (replayproxy.capacity.memory) and, given a trace or result files, the tokens the
workload keeps resident (replayproxy.capacity.residency). Formulas: docs/capacity.md.
Exit status: 0 when everything fits, 1 when the weights, max-model-len or the workload's peak do not.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from replayproxy.capacity import residency
from replayproxy.capacity.loading import load_model, parse_memory_size
from replayproxy.capacity.memory import (
    GIB,
    KV_DTYPE_BYTES,
    WEIGHT_BITS,
    Plan,
    Setup,
    plan,
    smallest_tp,
)
from replayproxy.capacity.presets import PRESETS
from replayproxy.errors import BadInputFile, BadOption
from replayproxy.results import SUFFIX as RESULT_SUFFIX
from replayproxy.results import load_results
from replayproxy.trace import expand_paths, load

CONTEXTS_TOKENS = (2048, 8192, 16384, 32768, 131072)
PREFIX_NOTE = (
    "prefix-cache sharing is not counted (a shared prefix is stored once): residency is an upper bound"
)
QUEUE_NOTE = "a request holds its input from arrival (send) on, queueing included: an upper bound"


EXAMPLES = (
    "replayproxy capacity --model Llama-3.1-8B --gpu-memory 80GiB --max-model-len 32768",
    "replayproxy capacity --model Llama-3.1-70B --gpu-memory 80GiB --tp 4 traces/",
    "replayproxy capacity --model ./config.json --gpu-memory 24GB --kv-dtype fp8 vllm.rpr --json",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="*", metavar="TRACE|RESULT", help="trace (.rpt) or result (.rpr) files"
    )
    parser.add_argument(
        "--model",
        required=True,
        help=f"config.json (or its folder), a llama.cpp .gguf, or a preset: {', '.join(PRESETS)}",
    )
    parser.add_argument(
        "--gpu-memory", required=True, help="memory of one GPU: 80GiB, 81559MiB, 24GB (G = GiB)"
    )
    parser.add_argument("--gpus", type=int, default=None, help="GPUs in all (default: --tp); more = replicas")
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: --gpus, else 1)")
    parser.add_argument(
        "--weight-dtype", choices=tuple(WEIGHT_BITS), help="weight format (default: the checkpoint's)"
    )
    parser.add_argument(
        "--kv-dtype", choices=tuple(KV_DTYPE_BYTES), default="auto", help="auto = the model's 16 bit"
    )
    parser.add_argument("--util", type=float, default=0.90, help="fraction of GPU memory the engine may use")
    parser.add_argument("--max-model-len", type=int, help="longest sequence (default: the model's maximum)")
    parser.add_argument("--block-size", type=int, default=16, help="KV-cache block size in tokens")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192, help="tokens per forward pass")
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="sequences per batch (sizes the logits)"
    )
    parser.add_argument(
        "--runtime-gib", type=float, default=1.5, help="CUDA context, workspaces, CUDA graphs"
    )
    parser.add_argument(
        "--activations-gib", type=float, help="override the activation estimate (default: estimated)"
    )
    parser.add_argument(
        "--assume-ttft-ms", type=float, default=200.0, help="for requests without recorded timings"
    )
    parser.add_argument(
        "--assume-tpot-ms", type=float, default=30.0, help="for requests without recorded timings"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    _check_numbers(args)
    spec, source = load_model(args.model)
    tp = args.tp or args.gpus or 1
    setup = Setup(
        gpu_memory_bytes=parse_memory_size(args.gpu_memory),
        gpus=args.gpus or tp,
        tp=tp,
        weight_dtype=args.weight_dtype or "",
        kv_dtype=args.kv_dtype,
        util=args.util,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        runtime_bytes=int(args.runtime_gib * GIB),
        activation_bytes=None if args.activations_gib is None else int(args.activations_gib * GIB),
    )
    result = plan(spec, setup)
    max_model_len = args.max_model_len or spec.max_position_embeddings or CONTEXTS_TOKENS[-1]
    fit = analyse(args, result) if args.paths else None
    if args.json:
        print(orjson.dumps(to_json(result, source, max_model_len, fit), option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(render(result, source, max_model_len, fit)))
    fits = result.kv_tokens >= max_model_len and (fit is None or fit.fits)
    return 0 if fits else 1


def _check_numbers(args: argparse.Namespace) -> None:
    positive = ("gpus", "tp", "max_model_len", "max_num_batched_tokens", "max_num_seqs")
    for name in positive:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BadOption(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    for name in ("runtime_gib", "activations_gib", "assume_ttft_ms", "assume_tpot_ms"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise BadOption(f"--{name.replace('_', '-')} must not be negative, not {value}")


def analyse(args: argparse.Namespace, result: Plan) -> residency.TraceFit:
    files = expand_paths(args.paths, suffix=RESULT_SUFFIX if _are_results(args.paths) else ".rpt")
    if files[0].suffix == RESULT_SUFFIX:
        timings = residency.from_results(load_results(files))
    else:
        timings = residency.from_trace(load(files))
    if not len(timings.arrival_ns):
        raise BadInputFile(f"{', '.join(map(str, args.paths))}: no request to fit (the files hold none)")
    ttft_ns, tpot_ns = int(args.assume_ttft_ms * 1e6), int(args.assume_tpot_ms * 1e6)
    filled, estimated, skipped = residency.estimate(timings, ttft_ns, tpot_ns)
    return residency.fit(filled, estimated, skipped, result.kv_tokens * result.replicas)


def _are_results(paths: list[str]) -> bool:
    for raw in paths:
        path = Path(raw)
        if path.suffix == RESULT_SUFFIX or path.is_dir() and any(path.glob(f"*{RESULT_SUFFIX}")):
            return True
    return False


def trace_limits(result: Plan, fit: residency.TraceFit) -> tuple[float, int]:
    """(smallest --util holding the peak, largest --max-model-len at which the peak's sequences all fit).

    The second one: every request in flight at the busiest moment could grow to max-model-len
    without preemption. Load is assumed evenly spread over replicas.
    """
    per_replica_tokens = -(-int(fit.peak_tokens) // result.replicas)
    per_replica_sequences = max(-(-fit.peak_concurrency // result.replicas), 1)
    longest = result.kv_blocks // per_replica_sequences * result.setup.block_size
    return result.util_for(per_replica_tokens), longest


def to_json(
    result: Plan, source: str, max_model_len: int, fit: residency.TraceFit | None
) -> dict[str, object]:
    spec, setup = result.spec, result.setup
    report: dict[str, object] = {
        "model": {
            "name": spec.name,
            "source": source,
            "params_total": result.params_total,
            "params_active": result.params_active,
            "attention": spec.attention_kind,
            "num_layers": spec.num_layers,
            "num_heads": spec.num_heads,
            "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "num_experts": spec.num_experts,
            "max_position_embeddings_tokens": spec.max_position_embeddings,
        },
        "setup": {
            "gpu_memory_bytes": setup.gpu_memory_bytes,
            "gpus": setup.gpus,
            "tp": setup.tp,
            "replicas": result.replicas,
            "weight_dtype": result.weight_dtype,
            "kv_dtype": setup.kv_dtype,
            "kv_dtype_bytes": KV_DTYPE_BYTES[setup.kv_dtype],
            "util": setup.util,
            "block_size_tokens": setup.block_size,
            "max_num_batched_tokens": setup.max_num_batched_tokens,
            "max_num_seqs": setup.max_num_seqs,
            "max_model_len_tokens": max_model_len,
        },
        "weights_total_bytes": result.weights_bytes,
        "per_gpu": {
            "budget_bytes": result.budget_per_gpu_bytes,
            "weights_bytes": result.weights_per_gpu_bytes,
            "activations_bytes": result.activation_per_gpu_bytes,
            "runtime_bytes": setup.runtime_bytes,
            "kv_bytes": result.kv_per_gpu_bytes,
        },
        "kv_bytes_per_token": result.kv_bytes_per_token,
        "kv_bytes_per_token_per_gpu": result.kv_bytes_per_token_per_gpu,
        "kv_blocks_per_replica": result.kv_blocks,
        "kv_tokens_per_replica": result.kv_tokens,
        "kv_tokens_total": result.kv_tokens * result.replicas,
        "weights_fit": result.weights_fit,
        "max_model_len_fits": result.kv_tokens >= max_model_len,
        "contexts": [
            {"context_tokens": c, "sequences": result.sequences_at(c)} for c in _contexts(max_model_len)
        ],
        "notes": list(result.notes),
        "trace": None,
    }
    if fit is not None:
        util, longest = trace_limits(result, fit)
        report["trace"] = {
            "requests": fit.requests,
            "estimated_requests": fit.estimated,
            "skipped_requests": fit.skipped,
            "chunk_timed_requests": fit.chunk_timed,
            "duration_s": fit.duration_s,
            "peak_resident_tokens": fit.peak_tokens,
            "peak_at_s": fit.peak_at_s,
            "p95_resident_tokens": fit.p95_tokens,
            "mean_resident_tokens": fit.mean_tokens,
            "peak_concurrent_requests": fit.peak_concurrency,
            "longest_request_tokens": fit.longest_request_tokens,
            "capacity_tokens": fit.capacity_tokens,
            "fits": fit.fits,
            "p95_fits": fit.p95_tokens <= fit.capacity_tokens,
            "time_over_capacity_s": fit.time_over_s,
            "first_over_capacity_s": fit.first_over_s,
            "smallest_util_for_peak": util,
            "largest_max_model_len_tokens": longest,
            "notes": [PREFIX_NOTE, QUEUE_NOTE],
        }
    return report


def _contexts(max_model_len: int) -> list[int]:
    """The table's context lengths: the usual ones up to max-model-len, and max-model-len itself."""
    return sorted({*(c for c in CONTEXTS_TOKENS if c <= max_model_len), max_model_len})


def render(result: Plan, source: str, max_model_len: int, fit: residency.TraceFit | None) -> list[str]:
    spec, setup = result.spec, result.setup
    kind = f"MoE {spec.num_experts} experts, {spec.experts_per_token} per token" if spec.is_moe else "dense"
    active = f", {result.params_active / 1e9:.2f} B active" if spec.is_moe else ""
    if spec.is_mla:
        kv_formula = f"{spec.num_layers} layers x ({spec.kv_lora_rank} + {spec.qk_rope_head_dim}) latent"
    else:
        kv_formula = f"2 x {spec.num_layers} layers x {spec.num_kv_heads} kv heads x {spec.head_dim}"
    kv_formula += f" x {KV_DTYPE_BYTES[setup.kv_dtype]} B"
    kv_name = f"auto = {spec.dtype}" if setup.kv_dtype == "auto" else setup.kv_dtype
    lines = [
        f"model      {spec.name} ({source})",
        f"           {result.params_total / 1e9:.2f} B parameters{active}, {kind}; {spec.attention_kind} "
        f"{spec.num_heads} heads / {spec.num_kv_heads} kv heads, {spec.num_layers} layers",
        f"weights    {result.weight_dtype}: {_gib(result.weights_bytes)} GiB in all, "
        f"{_gib(result.weights_per_gpu_bytes)} GiB per GPU (tp {setup.tp})",
        f"KV cache   {result.kv_bytes_per_token:,} B per token ({kv_formula}, {kv_name}); "
        f"{result.kv_bytes_per_token_per_gpu:,} B per GPU",
        "",
        _split_line(result),
    ]
    if not result.weights_fit:
        tp = smallest_tp(spec, setup)
        hint = f"--tp {tp}" if tp else "more GPUs"
        need, budget = _gib(result.weights_per_gpu_bytes), _gib(result.budget_per_gpu_bytes)
        lines.append(
            f"DOES NOT FIT: the weights alone need {need} GiB per GPU, more than the {budget} GiB budget; "
            f"try {hint} or a smaller --weight-dtype"
        )
    elif result.kv_blocks == 0:
        lines.append(
            "DOES NOT FIT: no memory is left for the KV cache after weights, activations and runtime"
        )
    lines.append(
        f"KV tokens  {result.kv_tokens:,} per replica ({result.kv_blocks:,} blocks of {setup.block_size})"
        + (f" x {result.replicas} replicas" if result.replicas > 1 else "")
    )
    if result.kv_blocks and result.kv_tokens < max_model_len:
        lines.append(
            f"           max-model-len {max_model_len:,} exceeds the KV cache: the engine refuses to start; "
            f"the largest that fits is {result.kv_tokens:,}"
        )
    if result.kv_blocks:
        lines += ["", "   context  sequences at once"]
        for context in _contexts(max_model_len):
            mark = "  (max-model-len)" if context == max_model_len else ""
            lines.append(f"{context:>10,}  {result.sequences_at(context):>9,}{mark}")
    lines += [f"note       {note}" for note in result.notes]
    if fit is not None:
        lines += ["", *_render_fit(result, fit)]
    return lines


def _split_line(result: Plan) -> str:
    """The seed's form: '80.00 GiB x 0.90 = 72.00 GiB per GPU: weights 14.96 / activations 1.00 / ...'."""
    shares = (
        ("weights", result.weights_per_gpu_bytes),
        ("activations", result.activation_per_gpu_bytes),
        ("runtime", result.setup.runtime_bytes),
        ("KV", result.kv_per_gpu_bytes),
    )
    split = " / ".join(f"{name} {_gib(value)}" for name, value in shares)
    memory, util = _gib(result.setup.gpu_memory_bytes), result.setup.util
    return f"{memory} GiB x {util:.2f} = {_gib(result.budget_per_gpu_bytes)} GiB per GPU: {split}"


def _render_fit(result: Plan, fit: residency.TraceFit) -> list[str]:
    timing = f"{fit.chunk_timed:,} followed through chunk times"
    if fit.estimated:
        timing += f", {fit.estimated:,} with assumed ttft/tpot"
    if fit.skipped:
        timing += f", {fit.skipped:,} without token counts left out"
    lines = [
        f"workload   {fit.requests:,} requests over {fit.duration_s:,.1f} s ({timing})",
        f"resident   peak {fit.peak_tokens:,.0f} tokens at {fit.peak_at_s:,.1f} s, "
        f"p95 {fit.p95_tokens:,.0f}, mean {fit.mean_tokens:,.0f}; "
        f"peak {fit.peak_concurrency:,} requests in flight",
    ]
    share = fit.peak_tokens / max(fit.capacity_tokens, 1)
    if not fit.capacity_tokens:
        lines.append("fits       NO: there is no KV cache")
    elif fit.fits:
        lines.append(f"fits       yes: the peak uses {share:.0%} of {fit.capacity_tokens:,} KV tokens")
    else:
        over = f"{fit.time_over_s:,.1f} s ({fit.time_over_s / max(fit.duration_s, 1e-9):.1%} of the time)"
        first = f", first at {fit.first_over_s:,.1f} s" if fit.first_over_s is not None else ""
        lines.append(
            f"fits       NO: the peak is {share:.0%} of {fit.capacity_tokens:,} KV tokens; "
            f"over it for {over}{first}"
        )
    util, longest = trace_limits(result, fit)
    util_text = f"{util:.3f}" if util <= 1 else f"{util:.3f} (more than the whole GPU)"
    lines += [
        f"limits     smallest --util holding the peak: {util_text}",
        f"           largest --max-model-len at which the peak's {fit.peak_concurrency:,} requests all fit: "
        f"{longest:,} (longest request in the workload: {fit.longest_request_tokens:,})",
        f"note       {PREFIX_NOTE}",
        f"note       {QUEUE_NOTE}",
    ]
    return lines


def _gib(value: int) -> str:
    return f"{value / GIB:.2f}"
