"""Writes tests/data/trace-v1-golden.rpt, the version-1 file every later reader must keep loading.

Run once per format version (`python tests/data/make_golden.py`) and commit the output; never
regenerate an existing version's file, since its bytes are the point of the test.
"""

from __future__ import annotations

from pathlib import Path

from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_trace

OUT = Path(__file__).parent / "trace-v1-golden.rpt"
START_WALL_NS = 1_700_000_000_000_000_000


def golden_header() -> TraceHeader:
    return TraceHeader(
        start_wall_ns=START_WALL_NS,
        source="synth",
        block_size=16,
        block_unit="token",
        key_fingerprint="00112233445566ff",
        upstream="http://127.0.0.1:8000",
        recorder="golden",
    )


def golden_shapes() -> list[RequestShape]:
    return [
        RequestShape(
            offset_ns=0,
            model="llama-3-8b",
            input_tokens=1200,
            output_tokens=200,
            max_tokens=256,
            roles="su",
            prefix_hashes=(0x0123456789ABCDEF, 2**64 - 1),
            prefix_units=1200,
            status=200,
            ttft_ns=150_000_000,
            e2e_ns=2_000_000_000,
            chunk_gaps_us=(20_000, 21_000, 2**32 - 1),
            cached_tokens=1024,
            session=0xFEEDFACECAFEBEEF,
            turn=2,
            request_bytes=5000,
            response_bytes=9000,
        ),
        RequestShape(
            offset_ns=250_000_000,
            endpoint="completions",
            model="llama-3-8b",
            stream=False,
            input_tokens=40,
            output_tokens=10,
            output_estimated=True,
            sampling={"temperature": 0.7, "n": True, "stop": True},
            has_tools=True,
            has_response_format=True,
            status=200,
        ),
        RequestShape(
            offset_ns=10**9, model="qwen2-7b", input_tokens=333, status=503, error="http_5xx", e2e_ns=5_000
        ),
    ]


if __name__ == "__main__":
    OUT.unlink(missing_ok=True)
    write_trace(OUT, golden_header(), golden_shapes(), mono_ns=lambda: 0, wall_ns=lambda: START_WALL_NS)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
