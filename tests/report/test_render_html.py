"""The HTML report: self-contained (nothing fetched), plots present, and it renders in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from replayproxy.cli import main
from tests.report.helpers import result, synthetic_run, write_run

pytest.importorskip("matplotlib", reason="the HTML report needs the [report] extra (matplotlib)")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report for both tests (drawing the plots is the slow part)."""
    tmp_path = tmp_path_factory.mktemp("html")
    rng = np.random.default_rng(4)
    ttft = rng.lognormal(3.5, 0.5, 300)
    e2e = ttft + rng.lognormal(6, 0.3, 300)
    paths = [
        synthetic_run(tmp_path / "a.rpr", ttft, e2e, label="A"),
        synthetic_run(tmp_path / "b.rpr", ttft * 0.6, e2e * 0.9, label="B"),
    ]
    for speed in (1, 2, 4):  # a small sweep of another target
        results = [
            result(
                i,
                sent_ms=100.0 * i / speed,
                ttft_ms=20 * speed,
                e2e_ms=200 * speed,
                prompt_tokens=100 * (i + 1),
                completion_tokens=5,
                gaps_us=[1000] * 4,
            )
            for i in range(40)
        ]
        paths.append(
            write_run(
                tmp_path / f"speed-{speed}.rpr",
                results,
                target="http://sweep",
                options={"speed": speed},
                digest="d2",
            )
        )
    html = tmp_path / "report.html"
    assert (
        main(
            [
                "report",
                *map(str, paths),
                "--slo",
                "ttft<=60ms",
                "--html",
                str(html),
                "-o",
                str(tmp_path / "report.txt"),
            ]
        )
        == 0
    )
    return html


def test_html_is_self_contained_with_plots_and_tables(report_html: Path) -> None:
    text = report_html.read_text(encoding="utf-8")
    # The panel at a glance, CDFs (TTFT, TPOT, E2E, ITL, schedule lag), goodput against the SLO,
    # latency over time, in flight, TTFT by input length, sweep against offered req/s
    assert text.count("<svg") == 7
    titles = ("At a glance: each candidate with its 95% interval", "Latency CDFs", "Goodput against the SLO",
              "Latency over time", "In-flight requests", "TTFT by input length", "Sweep")  # fmt: skip
    for title in titles:
        assert f">{title}</h2>" in text
    assert "<table>" in text and "Paired: B vs A" in text and "operating point at" in text
    # A navigation bar first, then the verdict box, then the panel at a glance, then the plots.
    assert text.index("<nav>") < text.index('<div class="verdict">') < text.index('id="at-a-glance"')
    nav = text[text.index("<nav>") : text.index("</nav>")]
    for anchor in re.findall(r'href="#([^"]+)"', nav):
        assert f'id="{anchor}"' in text, anchor
    assert '<a href="#verdict">Verdict</a>' in nav and '<a href="#latency">Latency</a>' in nav
    # Plots follow the page's width: the SVG is as wide as its column, its height from its viewBox.
    assert "figure svg { width: 100%; height: auto;" in text and "viewBox" in text
    # Nothing to fetch: no scripts, stylesheets, images or fonts from anywhere.
    assert not re.search(r"<(script|link|img|iframe)\b", text)
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:|//)""", text)
    assert "@import" not in text and "url(http" not in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_html_renders_in_headless_chromium(report_html: Path, tmp_path: Path) -> None:
    from PIL import Image

    html = report_html
    shot = tmp_path / "shot.png"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=2400,3000",  # a wide screen: fixed-width plots would fill half of it
        html.resolve().as_uri(),
    ]
    subprocess.run(command, capture_output=True, timeout=90, check=False)
    assert shot.exists(), "chromium wrote no screenshot"
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(np.int64)
    assert pixels.shape[:2] == (3000, 2400)
    non_white = (pixels < 240).any(axis=2).mean()
    assert non_white > 0.02, "screenshot is (nearly) blank"
    # matplotlib's first two line colours (#1f77b4 blue, #ff7f0e orange) prove the plots were drawn.
    for rgb in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):
        close = (np.abs(pixels - np.array(rgb)).sum(axis=2) < 60).sum()
        assert close > 200, f"no plot lines of colour {rgb} in the screenshot"
    # No half page left empty: the plots span the page, so the right half holds about as much
    # drawing as the left (fixed-width plots left it nearly all background).
    drawn = (pixels < 240).any(axis=2)
    left, right = drawn[:, :1200].mean(), drawn[:, 1200:].mean()
    assert right > 0.4 * left, f"the right half is nearly empty ({right:.3f} drawn vs {left:.3f} on the left)"


def test_no_plot_has_overlapping_tick_labels(report_html: Path) -> None:
    """Every figure of the report, drawn as the report draws it: no two visible tick labels of an
    axis overlap (matplotlib's own extents of the drawn labels)."""
    from replayproxy.report.document import build_document
    from replayproxy.report.goodput import parse_slo
    from replayproxy.report.plot_axes import overlapping_ticks, readable
    from replayproxy.report.plot_panel import comparison_panel
    from replayproxy.report.plots import PLOTS
    from replayproxy.report.runs import load_runs

    runs = load_runs(sorted(report_html.parent.glob("*.rpr")))
    doc = build_document(runs, slos=parse_slo("ttft<=60ms"), slo_spec="ttft<=60ms", resamples=200)
    drawn = 0
    for draw in (comparison_panel, *(plot for _, plot in PLOTS)):
        fig = draw(doc, runs)
        if fig is None:
            continue
        readable(fig)
        assert overlapping_ticks(fig) == [], draw.__name__
        drawn += 1
    assert drawn == 7


def test_crowded_tick_labels_are_found_and_thinned() -> None:
    from matplotlib.figure import Figure

    from replayproxy.report.plot_axes import overlapping_ticks, readable

    fig = Figure(figsize=(4, 3))
    ax = fig.subplots()
    ax.plot([100, 5000], [0, 1])
    ax.set_xscale("log")
    ax.set_xticks([100 + 50 * i for i in range(60)], [f"{100 + 50 * i} ms" for i in range(60)])
    assert overlapping_ticks(fig)  # the smear the CDF of E2E once was
    readable(fig)
    assert overlapping_ticks(fig) == []
    assert 1 <= sum(1 for t in ax.get_xticklabels() if t.get_text()) <= 12


def test_html_of_runs_without_any_success(tmp_path: Path) -> None:
    empty = write_run(tmp_path / "empty.rpr", [], label="empty")
    failed = write_run(tmp_path / "fail.rpr", [result(i, error="connect") for i in range(3)], label="fail")
    html = tmp_path / "r.html"
    assert main(["report", str(empty), str(failed), "--html", str(html), "-o", str(tmp_path / "r.txt")]) == 0
    text = html.read_text(encoding="utf-8")
    assert "<svg" in text and "100.0% (3)" in text
