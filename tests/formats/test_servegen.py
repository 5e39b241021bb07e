"""ServeGen client distributions sampled into a workload: ServeGen's own rules, deterministic by seed.

The fixture is written in the published layout (alibaba/ServeGen `data/language/m-large`): the
trace rows are the first four of `chunk-0-trace.csv` as published (Apache-2.0); the length
distributions are small ones in the dataset files' own string form.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pytest

from replayproxy import cli
from replayproxy.formats import servegen
from replayproxy.formats.importing import ImportFormatError, ImportOptions
from replayproxy.trace import load
from tests.cli import run_cli

TRACE_ROWS = (  # chunk-0-trace.csv of m-large, first four windows, byte for byte
    "0,1.3316666666666668,8.598383725990791,Weibull,0.3753486140101707,0.3967677807107179\n"
    "600,0,0,,0,0\n"
    "1200,0.2733333333333333,6.016918484717946,Weibull,0.4949831672353574,3.3810771356697296\n"
    "1800,0.15,4.068197850957398,Gamma,0.060422107316638725,103.65095274189687\n"
)
EARLY = {"input_tokens": "{224: 0.25, 225: 0.5, 300: 0.25}", "output_tokens": "{40: 0.5, 41: 0.5}"}
LATE = {"input_tokens": "{1000: 1.0}", "output_tokens": "{7: 0.2, 9: 0.8}"}


def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "m-large"
    folder.mkdir()
    (folder / "chunk-0-trace.csv").write_text(TRACE_ROWS)
    (folder / "chunk-0-dataset.json").write_bytes(orjson.dumps({"0": EARLY, "1800": LATE}))
    (folder / "chunk-3-trace.csv").write_text("0,0.5,1.0,Gamma,1.0,2.0\n600,0,0,,0,0\n")
    (folder / "chunk-3-dataset.json").write_bytes(
        orjson.dumps({"0": {"input_tokens": "{50: 1.0}", "output_tokens": "{5: 1.0}"}})
    )
    return folder


def test_windows_rates_and_lengths_follow_servegens_rules(tmp_path: Path) -> None:
    imported = servegen.read(model_dir(tmp_path), ImportOptions(duration_s=2400))
    seconds = imported.offset_ns / 1e9
    inputs, outputs = imported.input_tokens, imported.output_tokens
    client3 = inputs == 50
    # ceil(rate x window) gaps rescaled to fill the window: the last lands on its end and is dropped
    first = (seconds < 600) & ~client3
    assert first.sum() == math.ceil(1.3316666666666668 * 600) - 1
    assert ((seconds >= 600) & (seconds < 1200) & ~client3).sum() == 0  # a window without traffic
    assert client3.sum() == 0.5 * 600 - 1 and seconds[client3].max() < 600  # only in its first window
    # a dataset holds from its window until the next one: 1800 s on, the late distributions
    late = seconds >= 1800
    assert set(inputs[late].tolist()) == {1000} and set(outputs[late].tolist()) <= {7, 9}
    early = ~late & ~client3
    assert set(inputs[early].tolist()) <= {224, 225, 300} and set(outputs[early].tolist()) <= {40, 41}
    assert abs(float(np.mean(inputs[early] == 225)) - 0.5) < 0.1
    # one uniform per request for every field, as ServeGen draws them: lengths move together
    assert np.all(outputs[early][inputs[early] == 224] == 40)
    assert np.all(outputs[early][inputs[early] == 300] == 41)
    assert imported.columns["model"] == "m-large"


def test_same_seed_same_workload_other_seed_another(tmp_path: Path) -> None:
    folder = model_dir(tmp_path)
    runs = [servegen.read(folder, ImportOptions(seed=seed, duration_s=1200)) for seed in (4, 4, 5)]
    assert np.array_equal(runs[0].offset_ns, runs[1].offset_ns)
    assert np.array_equal(runs[0].input_tokens, runs[1].input_tokens)
    assert not np.array_equal(runs[0].offset_ns[:50], runs[2].offset_ns[:50])


def test_import_command_start_duration_and_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sg.rpt"
    args = ["import", str(model_dir(tmp_path)), "-f", "servegen", "--start", "1500", "--duration", "600"]
    assert cli.main([*args, "--seed", "2", "-o", str(out), "--quiet"]) == 0
    cols = load(out)
    # [1500, 2100): the tail of the 1200 s window and the head of the 1800 s one, rebased to 0
    assert 0 < len(cols) < 0.28 * 300 + 0.15 * 300 + 10
    assert cols.offset_ns[0] >= 0 and cols.offset_ns[-1] < 600e9
    assert cols.headers[0].source == "import:servegen"
    assert cols.headers[0].extra["servegen"] == {"clients": 2, "start_s": 1500.0, "end_s": 2100.0, "seed": 2}


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = model_dir(tmp_path)
    (folder / "chunk-0-trace.csv").write_text(TRACE_ROWS + "2400,0.2,1.0,Poisson,1,1\n")
    with pytest.raises(ImportFormatError, match=r"chunk-0-trace.csv:5: arrival pattern 'Poisson'"):
        servegen.read(folder, ImportOptions())
    assert len(servegen.read(folder, ImportOptions(skip_bad=True, duration_s=600))) > 0
    (folder / "chunk-3-dataset.json").unlink()
    assert cli.main(["import", str(folder), "-f", "servegen", "-o", str(tmp_path / "x.rpt")]) == 2
    err = capsys.readouterr().err
    assert "chunk-3-dataset.json: missing" in err and err.count("\n") == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ImportFormatError, match="no ServeGen chunk"):
        servegen.read(empty, ImportOptions())


def test_a_huge_rate_or_token_count_is_refused_before_it_is_sampled(tmp_path: Path) -> None:
    """A window rate of 300,000/s asked 180 M arrivals (50 s, 6.9 GB); a length of 1e12 tokens an
    array of 1e12 probabilities. Both are one line naming the file, before anything is sized by them."""
    folder = model_dir(tmp_path)
    (folder / "chunk-0-trace.csv").write_text("0,300000,1.0,Gamma,1.0,1.0\n")
    with pytest.raises(ImportFormatError, match=r"chunk-0-trace.csv: window 0 s: rate 300000/s makes"):
        servegen.read(folder, ImportOptions())
    (folder / "chunk-0-trace.csv").write_text(TRACE_ROWS)
    huge = {"input_tokens": "{1e12: 1.0}", "output_tokens": "{5: 1.0}"}
    (folder / "chunk-0-dataset.json").write_bytes(orjson.dumps({"0": huge}))
    with pytest.raises(ImportFormatError, match=r"chunk-0-dataset.json: window 0 field input_tokens: 1e\+12"):
        servegen.read(folder, ImportOptions())
    out = str(tmp_path / "x.rpt")
    for duration in ("inf", "1e300"):
        done = run_cli("import", str(folder), "-f", "servegen", "--duration", duration, "-o", out)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--duration" in done.stderr
