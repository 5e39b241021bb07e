"""ServeGen (alibaba/ServeGen) client distributions, sampled into a workload deterministically by seed.

ServeGen publishes no request log but, per model, one pair of files per client:
`chunk-<id>-trace.csv` — `window_start_s,rate,cv,pattern,shape,scale` per 600 s window, pattern
`Gamma` or `Weibull` for the inter-arrival times (empty when the client sent nothing) — and
`chunk-<id>-dataset.json` — `{window_start_s: {field: "{tokens: probability, ...}"}}`, each field a
distribution over token counts, valid from its window until the next. Sampling follows ServeGen's
own `servegen/construct.py` (`generate_workload` with the clients' own rates): per client and window,
`ceil(rate × window)` gaps from the pattern, rescaled to fill the window, the arrivals before its
end kept; lengths by inverse CDF with one uniform for all of a request's fields, as ServeGen draws
them. A numpy Generator seeded with (seed, client id) makes the result independent of file order.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from replayproxy.formats.importing import BadLines, Imported, ImportFormatError, ImportOptions
from replayproxy.shape import MAX_OFFSET_S, MAX_TOKENS

PATTERNS = ("Gamma", "Weibull")
DEFAULT_DURATION_S = 600.0  # one ServeGen window; a model's clients send up to thousands per second
MAX_REQUESTS = 1 << 23  # requests sampled at most (~50 bytes each while sampled: ~400 MB)
_PDF_ENTRY = re.compile(r"\s*(-?[0-9.eE+-]+)\s*:\s*([0-9.eE+-]+)\s*")
_CHUNK = re.compile(r"chunk-(\d+)-(dataset\.json|trace\.csv)$")


def read(path: Path, options: ImportOptions) -> Imported:
    """A model directory (or one client's file of it) sampled over [start, start + duration)."""
    clients = _client_files(path)
    start = options.start_s
    end = start + (options.duration_s if options.duration_s is not None else DEFAULT_DURATION_S)
    bad = BadLines(str(path), options.skip_bad)
    offsets: list[np.ndarray] = []
    inputs: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    ignored: set[str] = set()
    sampled = 0  # arrivals drawn so far, checked against MAX_REQUESTS before each window is drawn
    for client, (trace_file, dataset_file) in sorted(clients.items()):
        file_bad = BadLines(str(trace_file), options.skip_bad)
        windows = _trace_windows(trace_file, file_bad)
        bad.count, bad.first = bad.count + file_bad.count, bad.first or file_bad.first
        lengths = _datasets(dataset_file)
        rng = np.random.default_rng([options.seed, client])
        for window_start, size, rate, pattern, shape, scale in _spanned(windows, start, end):
            lengths_at = _dataset_at(lengths, window_start)
            if lengths_at is None:
                continue
            if sampled + rate * size > MAX_REQUESTS:  # before ceil: rate x size may be inf
                raise ImportFormatError(
                    f"{trace_file}: window {window_start:g} s: rate {rate:g}/s makes"
                    f" {sampled + rate * size:.0f} requests so far, past the {MAX_REQUESTS} an import"
                    " samples (a shorter --duration samples fewer)"
                )
            sampled += math.ceil(rate * size)
            times = _arrivals(window_start, size, rate, pattern, shape, scale, rng)
            if not len(times):
                continue
            sampled_in, sampled_out, others = _lengths(lengths_at, len(times), rng, dataset_file)
            ignored |= others
            offsets.append(np.rint((times - start) * 1e9).astype(np.int64))
            inputs.append(sampled_in)
            outputs.append(sampled_out)
    warnings = [f"{path}: ServeGen fields not kept: {', '.join(sorted(ignored))}"] if ignored else []
    return Imported(
        source="servegen",
        offset_ns=np.concatenate(offsets) if offsets else np.zeros(0, np.int64),
        input_tokens=np.concatenate(inputs) if inputs else np.zeros(0, np.int64),
        output_tokens=np.concatenate(outputs) if outputs else np.zeros(0, np.int64),
        bad=bad,
        columns={"model": options.model or (path.resolve().name if path.is_dir() else "")},
        extra={"servegen": {"clients": len(clients), "start_s": start, "end_s": end, "seed": options.seed}},
        warnings=warnings,
    )


def _client_files(path: Path) -> dict[int, tuple[Path, Path]]:
    """Client id -> (trace file, dataset file); a single chunk file stands for its client alone."""
    if not path.exists():
        raise ImportFormatError(f"{path}: no such file or directory")
    files = list(path.iterdir()) if path.is_dir() else [path]
    ids = {int(m.group(1)) for f in files if (m := _CHUNK.search(f.name))}
    if not ids:
        raise ImportFormatError(
            f"{path}: no ServeGen chunk-<id>-trace.csv / chunk-<id>-dataset.json files "
            "(give a model directory such as data/language/m-large)"
        )
    folder = path if path.is_dir() else path.parent
    pairs = {}
    for client in ids:
        trace_file, dataset_file = (
            folder / f"chunk-{client}-trace.csv",
            folder / f"chunk-{client}-dataset.json",
        )
        for needed in (trace_file, dataset_file):
            if not needed.is_file():
                raise ImportFormatError(f"{needed}: missing (each ServeGen client has a trace and a dataset)")
        pairs[client] = (trace_file, dataset_file)
    return pairs


_MAX_PARAMETER = 1e6  # a gap distribution's shape or scale (published: 0.06..200); larger ones overflow sums
Window = tuple[float, float, float, str, float, float]  # start s, size s, rate, pattern, shape, scale


def _trace_windows(path: Path, bad: BadLines) -> list[Window]:
    """The client's windows with traffic; each lasts until the next window's start (the last: open)."""
    rows: list[tuple[float, float, float, str, float, float]] = []
    with open(path, encoding="utf-8", errors="replace") as stream:
        for no, line in enumerate(stream, 1):
            if not line.strip():
                continue
            problem, row = _trace_row(line)
            if problem:
                bad(no, problem)
                continue
            rows.append(row)
    starts = [r[0] for r in rows]
    if starts != sorted(starts):
        raise ImportFormatError(f"{path}: window start times are not in ascending order")
    sizes = np.diff([*starts, math.inf]).tolist()
    return [
        (start, size, rate, pattern, shape, scale)
        for (start, rate, _, pattern, shape, scale), size in zip(rows, sizes, strict=True)
        if pattern and rate > 0
    ]


def _trace_row(line: str) -> tuple[str | None, tuple[float, float, float, str, float, float]]:
    fields = line.strip().split(",")
    empty = (0.0, 0.0, 0.0, "", 0.0, 0.0)
    if len(fields) != 6:
        return f"{len(fields)} fields; expected window_start,rate,cv,pattern,shape,scale", empty
    try:
        start, rate, cv, shape, scale = (float(fields[i]) for i in (0, 1, 2, 4, 5))
    except ValueError:
        return f"not numbers: {fields[:3] + fields[4:]}", empty
    pattern = fields[3]
    if pattern and pattern not in PATTERNS:
        return f"arrival pattern {pattern!r}; expected one of {list(PATTERNS)} or empty", empty
    if not all(math.isfinite(v) for v in (start, rate, cv, shape, scale)) or min(start, rate, cv) < 0:
        return "negative or non-finite window start, rate or cv", empty
    if start > MAX_OFFSET_S:
        return f"window start {start:g} s is past {MAX_OFFSET_S:g} s", empty
    if pattern and rate > 0 and not (0 < shape <= _MAX_PARAMETER and 0 < scale <= _MAX_PARAMETER):
        return (
            f"{pattern} shape and scale must be within (0, {_MAX_PARAMETER:g}], got {shape}, {scale}",
            empty,
        )
    return None, (start, rate, cv, pattern, shape, scale)


Datasets = list[tuple[float, dict[str, np.ndarray]]]  # (window start s, field -> CDF) in time order


def _datasets(path: Path) -> Datasets:
    """(window start, field -> CDF over token counts 0..max) in time order; empty PDFs are skipped."""
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise ImportFormatError(f"{path}: not JSON ({e})") from e
    if not isinstance(data, dict):
        raise ImportFormatError(f"{path}: expected an object of windows, got {type(data).__name__}")
    windows = []
    for start, fields in data.items():
        try:
            at = float(start)
        except ValueError as e:
            raise ImportFormatError(f"{path}: window {start!r} is not a number of seconds") from e
        if not isinstance(fields, dict):
            raise ImportFormatError(f"{path}: window {start}: expected an object of fields")
        cdfs = {name: _cdf(text, path, start, name) for name, text in fields.items()}
        if all(len(c) for c in cdfs.values()):  # ServeGen drops a window with an empty field
            windows.append((at, cdfs))
    return sorted(windows, key=lambda w: w[0])


def _cdf(text: Any, path: Path, start: str, name: str) -> np.ndarray:
    """`"{224: 0.0003, 225: 0.0008}"` (a Python dict literal, as published) as a CDF over 0..max."""
    where = f"{path}: window {start} field {name}"
    if not isinstance(text, str) or not text.strip().startswith("{") or not text.strip().endswith("}"):
        raise ImportFormatError(f'{where}: expected a distribution like "{{224: 0.0003, ...}}"')
    body = text.strip()[1:-1]
    if not body.strip():
        return np.zeros(0)
    entries = [_PDF_ENTRY.fullmatch(part) for part in body.split(",")]
    if not all(entries):
        raise ImportFormatError(f"{where}: not a {{value: probability}} list")
    values = np.array([float(m.group(1)) for m in entries if m], np.float64)
    probabilities = np.array([float(m.group(2)) for m in entries if m], np.float64)
    if name == "reason_ratio" or not np.all(values == np.round(values)) or values.min() < 0:
        return np.array([1.0])  # not token counts (ratios): kept out, see _lengths
    if values.max() > MAX_TOKENS:  # the CDF is an array over 0..max
        raise ImportFormatError(
            f"{where}: {values.max():g} tokens is past the {MAX_TOKENS} a request can have"
        )
    pdf = np.zeros(int(values.max()) + 1)
    np.add.at(pdf, values.astype(np.int64), probabilities)
    return np.cumsum(pdf)


def _dataset_at(
    datasets: list[tuple[float, dict[str, np.ndarray]]], at: float
) -> dict[str, np.ndarray] | None:
    """The latest distributions published at or before `at` (ServeGen's `_get_dataset_window`)."""
    chosen = None
    for start, fields in datasets:
        if start > at:
            break
        chosen = fields
    return chosen


def _spanned(windows: list[Window], start: float, end: float) -> list[Window]:
    """Windows overlapping [start, end), cut to it (ServeGen's `span`)."""
    spanned = []
    for at, size, rate, pattern, shape, scale in windows:
        first, last = max(at, start), min(at + size, end)
        if last > first:
            spanned.append((first, last - first, rate, pattern, shape, scale))
    return spanned


def _arrivals(
    at: float, size: float, rate: float, pattern: str, shape: float, scale: float, rng: np.random.Generator
) -> np.ndarray:
    """ceil(rate × size) gaps from the window's pattern, rescaled to fill it; the arrivals inside it.

    The last arrival lands on the window's end (ServeGen keeps `t < end`, which rounding decides
    either way), so it is always left out: ceil(rate × size) − 1 arrivals.
    """
    n = math.ceil(rate * size)
    gaps = rng.gamma(shape, scale, n) if pattern == "Gamma" else rng.weibull(shape, n) * scale
    total = float(gaps.sum())
    if n == 0 or total <= 0:
        return np.zeros(0)
    times: np.ndarray = at + np.cumsum(gaps * (size / total))[:-1]
    return times


def _lengths(
    fields: dict[str, np.ndarray], n: int, rng: np.random.Generator, path: Path
) -> tuple[np.ndarray, np.ndarray, set[str]]:
    """Input and output tokens by inverse CDF; one uniform per request for all fields, as ServeGen."""
    input_field = "input_tokens" if "input_tokens" in fields else "text_tokens"
    if input_field not in fields or "output_tokens" not in fields:
        raise ImportFormatError(f"{path}: a window lacks input_tokens (or text_tokens) or output_tokens")
    u = rng.random(n)
    sampled_in = np.searchsorted(fields[input_field], u * fields[input_field][-1]).astype(np.int64)
    sampled_out = np.searchsorted(fields["output_tokens"], u * fields["output_tokens"][-1]).astype(np.int64)
    return sampled_in, np.maximum(sampled_out, 0), set(fields) - {input_field, "output_tokens"}
