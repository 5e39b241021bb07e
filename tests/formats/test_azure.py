"""Azure LLM inference traces: the 2023 file as published and the 2024 layout, with bad lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from replayproxy.formats import azure
from replayproxy.formats.importing import ImportFormatError, ImportOptions, write_imported
from replayproxy.trace import load
from tests.formats.helpers import DATA, SHARED_TRACES

SAMPLE = DATA / "azure_conv_2023_head60.csv"


def test_2023_excerpt_as_published(tmp_path: Path) -> None:
    assert not SAMPLE.read_bytes().endswith(b"\n") and b"\r\n" in SAMPLE.read_bytes()
    imported = azure.read(SAMPLE, ImportOptions(model="gpt-4"))
    write_imported(imported, tmp_path / "t.rpt", lambda: 0)
    cols = load(tmp_path / "t.rpt")
    assert len(cols) == 60
    assert cols.headers[0].start_wall_ns == 1_700_158_546_680_590_000  # 2023-11-16 18:15:46.6805900 UTC
    assert cols.offset_ns[:2].tolist() == [0, 4_314_579_000]  # 18:15:50.9951690, 100 ns digits kept
    assert cols.input_tokens[:2].tolist() == [374, 396] and cols.output_tokens[:2].tolist() == [44, 109]
    assert cols.input_tokens[-1] == 389 and cols.output_tokens[-1] == 89  # last row, no newline after it
    assert set(cols.model) == {"gpt-4"} and set(cols.status) == {200} and len(cols.prefix_hashes) == 0


def test_2024_layout_with_zone_and_missing_fractions(tmp_path: Path) -> None:
    src = tmp_path / "AzureLLMInferenceTrace_conv_1week.csv"
    src.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-12 00:00:00.001163+00:00,1200,30\n"
        "2024-05-12 00:00:00+00:00,800,12\n"
        "2024-05-12 00:00:01.5+00:00,90,7\n"
    )
    imported = azure.read(src, ImportOptions())
    order = np.argsort(imported.offset_ns)
    assert (imported.offset_ns[order] - imported.offset_ns[order][0]).tolist() == [
        0,
        1_163_000,
        1_500_000_000,
    ]


def test_other_zones_are_converted_to_utc() -> None:
    assert (
        azure.times_ns(["2024-05-12 02:00:00+02:00", "2024-05-12T00:00:00Z"]).tolist()
        == [1_715_472_000_000_000_000] * 2
    )


def test_bad_lines(tmp_path: Path) -> None:
    src = tmp_path / "a.csv"
    src.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "yesterday,1,1\n2023-11-16 18:15:47,12\n2023-11-16 18:15:48,5,x\n2023-11-16 18:15:49,-5,1\n"
    )
    with pytest.raises(ImportFormatError, match=r"a.csv:3: TIMESTAMP 'yesterday' is not a date-time"):
        azure.read(src, ImportOptions())
    imported = azure.read(src, ImportOptions(skip_bad=True))
    assert len(imported) == 1 and imported.bad.count == 4
    with pytest.raises(ImportFormatError, match=r"h.csv:1: header .* lacks \['ContextTokens'\]"):
        (tmp_path / "h.csv").write_text("TIMESTAMP,Tokens,GeneratedTokens\n")
        azure.read(tmp_path / "h.csv", ImportOptions())


@pytest.mark.skipif(
    not (SHARED_TRACES / "AzureLLMInferenceTrace_conv.csv").exists(), reason="public traces absent"
)
def test_full_public_2023_file(tmp_path: Path) -> None:
    imported = azure.read(SHARED_TRACES / "AzureLLMInferenceTrace_conv.csv", ImportOptions())
    assert len(imported) == 19366 and imported.bad.count == 0
    span_s = (imported.offset_ns.max() - imported.offset_ns.min()) / 1e9
    assert 3490 < span_s < 3510  # 18:15:46 -> 19:14:08
    assert abs(imported.input_tokens.mean() - 1155) < 1 and abs(imported.output_tokens.mean() - 211) < 1
