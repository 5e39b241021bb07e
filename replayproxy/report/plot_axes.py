"""Readable axes for the HTML report's plots: few tick labels, none overlapping, checked when drawn.

matplotlib's default locators put a label on every decade of a log axis and its minor ticks, which
in a small panel (a CDF of E2E over four decades) runs the labels into one another. Before a
figure is saved its axes are given few ticks, then it is drawn and every axis whose visible tick
labels still overlap is thinned until they do not (`overlapping_ticks` says which overlap).
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

LINEAR_TICKS = 6  # at most this many labelled ticks on a linear axis
LOG_TICKS = 6  # on a log axis, labelled decades (or steps of them)
MAX_THINNING = 6  # passes of thinning before giving up (one label per axis always fits)


def readable(fig: Figure) -> None:
    """Give every axis of `fig` few labelled ticks, then thin those whose labels overlap when drawn."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                base = _base(axis)  # 1, 2, 5 times a power of ten; thinning drops the 2 and 5 first
                subs = (1.0, 2.0, 5.0) if base == 10 else (1.0,)
                axis.set_major_locator(LogLocator(base=base, subs=subs, numticks=LOG_TICKS))
                axis.set_major_formatter(FuncFormatter(_plain))  # 200, 1000, 0.5: read at a glance
                axis.set_minor_formatter(NullFormatter())  # minor ticks stay, unlabelled
            elif axis.get_scale() == "linear":
                axis.set_major_locator(MaxNLocator(nbins=LINEAR_TICKS, steps=[1, 2, 2.5, 5, 10]))
    for _ in range(MAX_THINNING):
        crowded = _crowded_axes(fig)
        if not crowded:
            return
        for crowded_axis, count in crowded:
            _thin(crowded_axis, count)


def overlapping_ticks(fig: Figure) -> list[str]:
    """'<axes title> x|y: "a" overlaps "b"' for each pair of visible tick labels that overlap."""
    out = []
    for axis, boxes in _label_boxes(fig):
        name = f"{axis.axes.get_title() or 'axes'} {'x' if axis is axis.axes.xaxis else 'y'}"
        for (text_a, a), (text_b, b) in combinations(boxes, 2):
            if _overlap(a, b):
                out.append(f'{name}: "{text_a}" overlaps "{text_b}"')
    return out


def _plain(value: float, _: object = None) -> str:
    return f"{value:g}"


def _base(axis: Axis) -> float:
    base = getattr(axis.get_transform(), "base", 10.0)
    return float(base)


def _thin(axis: Axis, count: int) -> None:
    from matplotlib.ticker import LogLocator, MaxNLocator

    fewer = max(1, count - 1)
    if axis.get_scale() == "log":  # powers of the base only, then fewer of them
        axis.set_major_locator(LogLocator(base=_base(axis), subs=(1.0,), numticks=fewer))
    else:
        axis.set_major_locator(MaxNLocator(nbins=fewer))


def _crowded_axes(fig: Figure) -> list[tuple[Axis, int]]:
    crowded = []
    for axis, boxes in _label_boxes(fig):
        if any(_overlap(a, b) for (_, a), (_, b) in combinations(boxes, 2)):
            crowded.append((axis, len(boxes)))
    return crowded


def _label_boxes(fig: Figure) -> list[tuple[Axis, list[tuple[str, Bbox]]]]:
    """Each axis's visible, non-empty tick labels (major and minor) with their drawn extents, in order."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig) if not isinstance(fig.canvas, FigureCanvasAgg) else fig.canvas
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    fig.draw(renderer)
    out: list[tuple[Axis, list[tuple[str, Bbox]]]] = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            boxes: list[tuple[float, str, Any]] = []
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                loc = tick.get_loc()
                if loc is None or not low <= loc <= high:
                    continue
                for label in (tick.label1, tick.label2):
                    if label.get_visible() and label.get_text():
                        boxes.append((loc, label.get_text(), label.get_window_extent(renderer)))
            boxes.sort(key=lambda b: b[0])
            out.append((axis, [(text, box) for _, text, box in boxes]))
    return out


def _overlap(a: Bbox, b: Bbox) -> bool:
    return bool(a.x1 > b.x0 and b.x1 > a.x0 and a.y1 > b.y0 and b.y1 > a.y0)
