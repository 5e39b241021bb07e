"""Shared pytest settings: every test is bounded (pytest-timeout in pyproject.toml).

`make test` runs the suite in two passes: everything not marked `serial` on several workers
(pytest-xdist; most tests wait on sockets and clocks, so three per core), then the `serial`
tests alone, because they measure wall-clock timing or pin processes to cores and would
measure their neighbours instead.
"""

from pathlib import Path

import pytest


def _expected_length(item: pytest.Item) -> tuple[float, bool]:
    """A timeout raised above the suite's default (pytest-timeout) is its author's bound on how long
    the test can take; a lowered one says nothing about length."""
    default = float(item.config.getini("timeout") or 0)
    timeout = item.get_closest_marker("timeout")
    bound = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
    return (bound if bound > default else 0.0), item.get_closest_marker("slow") is not None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first (tests with the largest own timeout, then the other slow ones), each followed by
    a short one, then the rest: a parallel run (`--dist load --maxschedchunk 1`) hands each worker
    two tests at a time, so this starts the long tests early, each on its own worker, instead of
    queueing one long test behind another (a stable sort: within each group, the files' order)."""
    ordered = sorted(items, key=_expected_length, reverse=True)
    long = [item for item in ordered if any(_expected_length(item))]
    short = ordered[len(long) :]
    paired = [test for pair in zip(long, short, strict=False) for test in pair]
    items[:] = paired + long[len(paired) // 2 :] + short[len(paired) // 2 :]


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json with a ChatML template, trained locally once per session."""
    pytest.importorskip("tokenizers")
    from tests import bpe

    return bpe.build(tmp_path_factory.mktemp("bpe"))
