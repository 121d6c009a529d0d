"""Tests for app.checkpoint: atomic saving, clear loading errors, and self-contained checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from app import checkpoint as checkpoint_module
from app.checkpoint import (
    CHECKPOINT_KEY,
    CheckpointError,
    read_checkpoint,
    save_atomically,
)
from app.inference.torch_engine import load_torch_engine
from app.training import checkpoint_io
from app.training.checkpoint_io import AtomicCheckpointIO

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MODEL_CFG = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "d_ff": 64,
    "dropout": 0.1,
    "share_src_tgt_embeddings": True,
    "max_positions": 32,
}
ATTENTION_CFG = {"kernel": "eager", "num_kv_heads": 2, "sites": {"cross": {"kernel": "sdpa"}}}


def test_save_atomically_writes_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "model.ckpt"  # missing parent directories are created
    save_atomically({"value": torch.arange(3)}, path)
    assert torch.equal(torch.load(path)["value"], torch.arange(3))
    save_atomically({"value": torch.arange(5)}, path)
    assert torch.equal(torch.load(path)["value"], torch.arange(5))
    assert [p.name for p in path.parent.iterdir()] == ["model.ckpt"]  # no temporary files left


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failed_save_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    path = tmp_path / "model.ckpt"
    save_atomically({"version": 1}, path)
    before = path.read_bytes()
    calls: list[object] = []

    def failing_save(obj: object, f) -> None:
        f.write(b"PK\x03\x04 half a zip archive")
        calls.append(obj)
        raise error

    monkeypatch.setattr(checkpoint_module.torch, "save", failing_save)
    with pytest.raises(type(error)):
        save_atomically({"version": 2}, path)
    assert calls == [{"version": 2}]
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.ckpt"]
    monkeypatch.undo()
    assert torch.load(path) == {"version": 1}


def test_lightning_checkpoint_io_saves_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    original = checkpoint_module.save_atomically

    def spy(obj: object, path) -> None:
        calls.append(Path(path))
        original(obj, path)

    monkeypatch.setattr(checkpoint_io, "save_atomically", spy)
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}}, tmp_path / "last.ckpt")
    assert calls == [tmp_path / "last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt") == {"state_dict": {}}


@pytest.fixture(scope="module")
def good_checkpoint(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    model = checkpoint_factory(path, model_cfg=MODEL_CFG, attention_cfg=ATTENTION_CFG)
    return path, model


def test_read_checkpoint_accepts_a_toolkit_checkpoint(good_checkpoint: tuple[Path, torch.nn.Module]) -> None:
    path, _ = good_checkpoint
    checkpoint = read_checkpoint(path)
    assert checkpoint[CHECKPOINT_KEY]["config"]["model"] == MODEL_CFG
    assert checkpoint["state_dict"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (None, "checkpoint not found"),
        (lambda p, good: p.write_bytes(good.read_bytes()[: good.stat().st_size // 2]), "truncated or not"),
        (lambda p, good: p.write_bytes(b""), "truncated or not a checkpoint"),
        (lambda p, good: p.write_text("model weights: see README\n"), "truncated or not a checkpoint"),
        (lambda p, good: torch.save({"a": 1}, p), "not a checkpoint written by this toolkit"),
        (lambda p, good: torch.save([1, 2, 3], p), "not a checkpoint written by this toolkit"),
        (lambda p, good: torch.save({"state_dict": {}, "epoch": 3}, p), "not a checkpoint written by this"),
    ],
    ids=["missing", "truncated", "empty", "text", "foreign_dict", "foreign_list", "other_lightning"],
)
def test_read_checkpoint_errors_are_clear(
    tmp_path: Path, good_checkpoint: tuple[Path, torch.nn.Module], make, message: str
) -> None:
    path = tmp_path / "bad.ckpt"
    if make is not None:
        make(path, good_checkpoint[0])
    with pytest.raises(CheckpointError, match=message) as err:
        read_checkpoint(path)
    assert str(path) in str(err.value)


def test_read_checkpoint_rejects_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        read_checkpoint(tmp_path)


def test_load_translator_restores_the_model(
    good_checkpoint: tuple[Path, torch.nn.Module], spm_tokenizer
) -> None:
    path, model = good_checkpoint
    translator, config = load_torch_engine(path)
    assert config == {"model": MODEL_CFG, "attention": ATTENTION_CFG}
    assert not translator.model.training
    restored = translator.model.state_dict()
    assert restored.keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        assert torch.equal(restored[name], value), name
    # The attention layout of the config is rebuilt: GQA everywhere, sdpa for cross-attention.
    layer = translator.model.decoder[0]
    assert layer.self_attn.num_kv_heads == 2
    assert type(layer.cross_attn.kernel).__name__ == "SDPAttention"
    assert translator.model.src_embed.weight is translator.model.output.weight
    assert translator.src_tokenizer.to_bytes() == spm_tokenizer.to_bytes()
    assert translator.max_source_tokens == 31
    src = torch.tensor([[5, 6, 7, 3]])
    tgt = torch.tensor([[2, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(translator.model(src, tgt), model(src, tgt))
