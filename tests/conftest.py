"""Shared fixtures: the Multi30k test corpus, a small sentencepiece model, tiny random Transformers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.training import REPO_ROOT, read_gz_lines

from app.attention.config import site_specs
from app.checkpoint import model_checkpoint, save_atomically
from app.data.subword_training import train_or_load
from app.data.tokenizer import SubwordConfig, Tokenizer
from app.models import Transformer, build_model

FIXTURE_DIR = REPO_ROOT / "tests" / "fixtures" / "multi30k"

# A tiny model: small enough that a whole test file runs in seconds on two CPU cores.
TINY_MODEL: dict[str, Any] = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "d_ff": 64,
    "dropout": 0.1,
    "pre_norm": True,
    "tie_embeddings": True,
    "share_src_tgt_embeddings": False,
    "max_positions": 64,
}


WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # `make test` runs one per core (xdist)


@pytest.fixture(scope="session", autouse=True)
def private_package_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``--compile aot`` packages go to a folder of this test session (subprocesses inherit it), never to
    the user's cache; tests that build the same model's packages share them, as processes do, and so do
    the session's parallel workers (their temporary folders share a parent)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if WORKERS > 1 else base) / "aot-packages"
    folder.mkdir(mode=0o700, exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_MT_AOT_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="session", autouse=True)
def threads_per_worker() -> Iterator[None]:
    """Parallel workers share the cores: each gets its share of torch threads, as do the processes its
    tests start (``OMP_NUM_THREADS``), so that no core runs more threads than one (OpenMP threads spin
    while they wait for a core)."""
    if WORKERS == 1:
        yield
        return
    share = max(1, (os.cpu_count() or 1) // WORKERS)
    before = torch.get_num_threads()
    torch.set_num_threads(share)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", str(share))
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def single_torch_thread() -> Iterator[None]:
    """One torch thread while a module's tests run (``pytestmark = usefixtures(...)``).

    The models in these tests are tiny: on a busy two-core machine PyTorch's default thread pool made
    them about 20x slower. The setting is restored afterwards, so tests that train real models in
    this process keep every core.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The committed Multi30k slice, tests/fixtures/multi30k (``MULTI30K_DIR`` points elsewhere).

    A missing directory fails every test that asked for it: a test that needs data never skips.
    """
    override = os.environ.get("MULTI30K_DIR")
    path = (REPO_ROOT / override).resolve() if override else FIXTURE_DIR
    if not (path / "train.de.gz").is_file():
        raise FileNotFoundError(f"no train.de.gz in {path} (MULTI30K_DIR={override!r})")
    return path


@pytest.fixture(scope="session")
def multi30k_slice(multi30k_dir: Path) -> tuple[list[str], list[str]]:
    """The first 500 German and English training sentences."""
    return read_gz_lines(multi30k_dir / "train.de.gz", 500), read_gz_lines(multi30k_dir / "train.en.gz", 500)


@pytest.fixture(scope="session")
def spm_tokenizer(
    multi30k_slice: tuple[list[str], list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Tokenizer:
    """A joint de+en unigram model with 200 pieces, trained on the slice."""
    src, tgt = multi30k_slice
    tokenizer, _ = train_or_load(
        src_texts=src,
        tgt_texts=tgt,
        config=SubwordConfig(vocab_size=200),
        cache_dir=tmp_path_factory.mktemp("spm"),
        corpus_key="m30k-test",
    )
    return tokenizer


def build_tiny_transformer(
    *,
    src_vocab_size: int = 40,
    tgt_vocab_size: int = 40,
    pad_id: int = 0,
    seed: int = 0,
    attention: dict[str, Any] | None = None,
    **model: Any,
) -> Transformer:
    """A tiny randomly initialised Transformer in eval mode (``model`` overrides :data:`TINY_MODEL`)."""
    torch.manual_seed(seed)
    options = {**TINY_MODEL, **model}
    options.pop("family")
    net = Transformer(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        pad_id=pad_id,
        attention=site_specs(attention or {"kernel": "eager"}),
        **options,
    )
    return net.eval()


@pytest.fixture
def tiny_transformer() -> Transformer:
    """A tiny random Transformer (vocabulary of 40 ids on both sides, pad id 0), in eval mode."""
    return build_tiny_transformer()


@pytest.fixture(scope="session")
def make_transformer() -> Callable[..., Transformer]:
    """:func:`build_tiny_transformer`, for tests that need several differently configured models."""
    return build_tiny_transformer


def write_checkpoint(
    path: Path,
    tokenizer: Tokenizer,
    *,
    model_cfg: dict[str, Any],
    attention_cfg: dict[str, Any],
    seed: int = 0,
    prepare: Callable[[torch.nn.Module], None] | None = None,
    data_cfg: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """Save a random model (changed by ``prepare`` if given) as a checkpoint, in the one format
    :mod:`app.checkpoint` defines for training and inference alike; ``data_cfg`` (e.g. ``directions``)
    becomes the run's ``data`` config."""
    torch.manual_seed(seed)
    model = build_model(
        model_cfg,
        attention_cfg,
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        pad_id=tokenizer.pad_id,
    )
    if prepare is not None:
        prepare(model)
    model.eval()
    config = {"model": model_cfg, "attention": attention_cfg, **({"data": data_cfg} if data_cfg else {})}
    save_atomically(model_checkpoint(model, config, tokenizer, tokenizer), path)
    return model


@pytest.fixture(scope="session")
def checkpoint_factory(spm_tokenizer: Tokenizer) -> Callable[..., torch.nn.Module]:
    """:func:`write_checkpoint` with the session's sentencepiece model unless given another."""

    def write(path: Path, tokenizer: Tokenizer | None = None, **kwargs: Any) -> torch.nn.Module:
        return write_checkpoint(path, tokenizer or spm_tokenizer, **kwargs)

    return write
