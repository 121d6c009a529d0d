"""Fixtures of the integration tests that train for real."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.training import END_TO_END_SLICE, write_corpus_slice

from app.inference.engine import Engine
from app.inference.engines import open_engine


@pytest.fixture(scope="session")
def corpus_slice(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plain-text de/en files holding the first lines of each split of the test corpus."""
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k"), END_TO_END_SLICE)


@pytest.fixture(scope="module")
def tiny_checkpoint(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A tiny untrained Transformer's checkpoint (eager attention), one per test module."""
    path: Path = tmp_path_factory.mktemp("tiny") / "model.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    return path


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Engine:
    """That checkpoint behind the torch engine, one per test module (the server tests)."""
    return open_engine(tiny_checkpoint)
