"""Shared pytest settings: every test is bounded (pytest-timeout in pyproject.toml)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json with a ChatML template, trained locally once per session."""
    pytest.importorskip("tokenizers")
    from tests import bpe

    return bpe.build(tmp_path_factory.mktemp("bpe"))
