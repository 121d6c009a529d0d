"""Training on packed batches (``data.layout=packed``) for real: Hydra config, datamodule, Lightning fit and
validation. Without dropout a packed run lands on the padded run's weights; an RNN refuses the layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.training import compose_train, tiny_overrides, write_corpus_slice

from app.data.batch import Batch, PackedBatch
from app.training.task import build_fit, train_or_exit

SLICE = {"train": 300, "val": 24, "test_2016_flickr": 10}


@pytest.fixture(scope="module")
def corpus(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k"), SLICE)


def fit(corpus: Path, out: Path, layout: str) -> tuple[dict[str, torch.Tensor], dict[str, float], int]:
    """Three optimizer steps and one validation of a tiny dropout-free model in ``layout``: its weights,
    validation metrics and the tokens it counted."""
    overrides = tiny_overrides(
        corpus,
        out / layout,
        out / "cache",  # one cache: the same tokenizer and batches for both layouts
        f"data.layout={layout}",
        "model.dropout=0.0",
        "trainer.max_steps=3",
        "trainer.limit_val_batches=1",
        "data.eval_max_tokens=200",
        "valid_search.max_len=8",
        "early_stopping.patience=0",
        "checkpoint.every_n_steps=null",
        "logger.kind=null",
    )
    run = build_fit(compose_train(overrides))
    batch = next(iter(run.datamodule.train_dataloader()))
    assert isinstance(batch, PackedBatch if layout == "packed" else Batch)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    assert run.trainer.global_step == 3
    metrics = run.trainer.validate(run.module, datamodule=run.datamodule, verbose=False)[0]
    weights = {name: p.detach().clone() for name, p in run.module.model.named_parameters()}
    return weights, metrics, run.module.tokens_trained


def test_a_packed_run_trains_and_validates_like_the_padded_one(corpus: Path, tmp_path: Path) -> None:
    padded, packed = fit(corpus, tmp_path, "padded"), fit(corpus, tmp_path, "packed")
    assert packed[2] == padded[2] > 0  # the same real tokens, counted on the host
    assert packed[1]["val/loss"] == pytest.approx(padded[1]["val/loss"], rel=1e-4)
    assert packed[1]["val/bleu"] == pytest.approx(padded[1]["val/bleu"], abs=1e-6)  # decoded padded, alike
    for name, weight in padded[0].items():
        if name.endswith("k_proj.bias"):  # softmax ignores a key bias: its gradient is rounding noise,
            continue  # which Adam scales up to +-lr (as in test_rdrop_training)
        torch.testing.assert_close(packed[0][name], weight, rtol=1e-4, atol=1e-5, msg=name)


def test_an_rnn_refuses_the_packed_layout_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before any data is read (the corpus directory does not even exist)."""
    overrides = [
        o
        for o in tiny_overrides(tmp_path / "none", tmp_path / "run", tmp_path / "cache")
        if "model." not in o
    ]
    with pytest.raises(SystemExit) as stopped:
        train_or_exit(compose_train([*overrides, "model=rnn", "data.layout=packed"]))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1
    assert "error: data.layout=packed: model.family=rnn does not train on packed batches" in err
    assert "use data.layout=padded" in err
