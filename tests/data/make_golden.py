"""Writes tests/data/trace-v<N>-golden.rpt, the version-N file every later reader must keep loading.

Run once per format version (`python tests/data/make_golden.py 2`) and commit the output; never
regenerate an existing version's file, since its bytes are the point of the test.
"""

from __future__ import annotations

import sys
from pathlib import Path

from replayproxy.shape import RequestShape
from replayproxy.trace import TraceHeader, write_trace

START_WALL_NS = 1_700_000_000_000_000_000


def golden_path(version: int) -> Path:
    return Path(__file__).parent / f"trace-v{version}-golden.rpt"


def golden_header(version: int = 1) -> TraceHeader:
    return TraceHeader(
        version=version,
        start_wall_ns=START_WALL_NS,
        source="synth",
        block_size=16,
        block_unit="token",
        key_fingerprint="00112233445566ff",
        upstream="http://127.0.0.1:8000",
        recorder="golden",
    )


def golden_shapes(version: int = 1) -> list[RequestShape]:
    shapes = [
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
    if version >= 2:  # sessions linked by replies: a first turn and the turn that continues it
        first = RequestShape(
            offset_ns=2 * 10**9, input_tokens=500, output_tokens=20, roles="su", status=200,
            e2e_ns=400_000_000, session=0xABCDEF0123456789, chat_id=0x1111222233334444,
        )  # fmt: skip
        shapes.append(first)
        shapes.append(
            first._replace(
                offset_ns=3 * 10**9,
                input_tokens=900,
                roles="suatt",
                turn=1,
                think_ns=600_000_000,
                chat_id=0x5555666677778888,
                parent_id=0x1111222233334444,
                tool_chars=321,
            )  # fmt: skip
        )
    return shapes


if __name__ == "__main__":
    version = int(sys.argv[1])
    out = golden_path(version)
    out.unlink(missing_ok=True)
    write_trace(
        out, golden_header(version), golden_shapes(version), mono_ns=lambda: 0, wall_ns=lambda: START_WALL_NS
    )
    print(f"wrote {out} ({out.stat().st_size} bytes)")
