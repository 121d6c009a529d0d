"""Fixtures of the integration tests that train for real."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.training import END_TO_END_SLICE, write_corpus_slice


@pytest.fixture(scope="session")
def corpus_slice(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain-text de/en files holding the first lines of each split of the test corpus."""
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k"), END_TO_END_SLICE)
