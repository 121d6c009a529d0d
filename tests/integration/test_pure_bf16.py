"""``trainer.precision=bf16-true``: weights, activations and optimizer state in bfloat16 (Lightning sets the
default dtype to bfloat16 while it runs). Training, validation's decoding (greedy and beam) and the test
decode must not assume float32 for the tensors they create, and the checkpoint translates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.training import compose_train, tiny_overrides, write_corpus_slice

from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.training.task import train

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize("valid_beam", [1, 2])
def test_pure_bf16_trains_validates_and_translates(
    multi30k_dir: Path, tmp_path: Path, valid_beam: int
) -> None:
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 120, "val": 8, "test_2016_flickr": 6}
    )
    run = tmp_path / "run"
    overrides = tiny_overrides(
        corpus,
        run,
        tmp_path / "cache",
        "trainer.precision=bf16-true",
        "trainer.max_steps=4",
        "trainer.val_check_interval=2",
        f"valid_search.beam={valid_beam}",
        "test_search.beam=3",
    )
    results = train(compose_train(overrides))
    assert results["global_step"] == 4 and results["test_bleu"] >= 0.0
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert {tensor.dtype for tensor in saved.values() if tensor.is_floating_point()} == {torch.bfloat16}
    outputs = open_engine(run / "checkpoints" / "last.ckpt").translate(
        ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee."], SearchSettings(beam=3, max_len=12)
    )
    assert len(outputs) == 3 and outputs[1] == ""
