"""Failures a long run must survive or report clearly: bad checkpoints, non-finite losses; averaging."""

from __future__ import annotations

import itertools
import logging
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from copy import deepcopy
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.device_reads import DeviceReads
from helpers.training import (
    REPO_ROOT,
    compose_train,
    read_trace,
    subprocess_env,
    tiny_overrides,
    write_corpus_slice,
)
from omegaconf import DictConfig

from app.checkpoint import CheckpointError, average_checkpoints, checkpoints_to_average, read_checkpoint
from app.inference.engine import SearchSettings
from app.inference.torch_engine import load_torch_engine
from app.training.losses import label_smoothed_nll
from app.training.module import NonFiniteLossError
from app.training.optim import Schedule, build_optimizer
from app.training.task import build_fit, fit_and_evaluate, train

SLICE = {"train": 400, "val": 40, "test_2016_flickr": 20}


@pytest.fixture(scope="module")
def corpus(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k"), SLICE)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def tiny_config(corpus: Path, cache_dir: Path, run_dir: Path, *extra: str) -> DictConfig:
    return compose_train(tiny_overrides(corpus, run_dir, cache_dir, "early_stopping.patience=0", *extra))


# -- resuming from a bad file --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"PK\x03\x04 half a zip archive"), "truncated or not a checkpoint"),
        (lambda p: torch.save({"weights": torch.zeros(3)}, p), "not a checkpoint written by this toolkit"),
    ],
    ids=["truncated", "foreign"],
)
def test_resuming_from_a_bad_checkpoint_is_a_clear_error(
    corpus: Path, cache_dir: Path, tmp_path: Path, make: Callable[[Path], None], message: str
) -> None:
    bad = tmp_path / "bad.ckpt"
    make(bad)
    cfg = tiny_config(corpus, cache_dir, tmp_path / "run", "trainer.max_steps=2", f"resume={bad}")
    with pytest.raises(CheckpointError, match=message) as err:
        train(cfg)
    assert str(bad) in str(err.value)


def test_resume_true_without_a_checkpoint_starts_fresh(corpus: Path, cache_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(corpus, cache_dir, tmp_path / "run", "trainer.max_steps=2", "resume=true")
    results = train(cfg)
    assert results["global_step"] == 2
    # where it ran, for reports that compare runs from different machines; no GPU memory on a CPU
    assert results["machine"]["device"] == "cpu" and results["machine"]["torch"] == torch.__version__
    assert results["machine"]["threads"] == torch.get_num_threads() and "peak_gpu_mb" not in results


# -- non-finite losses -----------------------------------------------------------------------------------


def test_nonfinite_loss_stops_with_step_and_batch_size(corpus: Path, cache_dir: Path, tmp_path: Path) -> None:
    run = build_fit(tiny_config(corpus, cache_dir, tmp_path / "run", "trainer.max_steps=3"))
    with torch.no_grad():
        run.module.model.encoder_norm.weight.fill_(math.nan)
    pattern = r"non-finite training loss \(nan\) at step 0 \(epoch 0\), batch of \d+ sentences, \d+ target"
    with pytest.raises(NonFiniteLossError, match=pattern) as err:
        run.trainer.fit(run.module, datamodule=run.datamodule)
    assert "nonfinite_loss=skip" in str(err.value)


def test_nonfinite_loss_skip_skips_exactly_the_bad_batches(
    corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """A NaN source embedding row poisons exactly the batches whose sources contain that subword."""
    trace = tmp_path / "trace.jsonl"
    cfg = tiny_config(
        corpus,
        cache_dir,
        tmp_path / "run",
        "nonfinite_loss=skip",
        "model.share_src_tgt_embeddings=false",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=0",
        f"debug.trace_batches={trace}",
    )
    run = build_fit(cfg)
    run.datamodule.setup("fit")
    sources = run.datamodule.datasets["train"].src
    rare = next(t for t in range(4, 500) if 2 <= sum(t in s for s in sources) <= 4)
    with torch.no_grad():
        run.module.model.src_embed.weight[rare] = math.nan
    run.trainer.fit(run.module, datamodule=run.datamodule)

    records = read_trace(trace)
    poisoned = [any(rare in sources[i] for i in r["ids"]) for r in records]
    assert 1 <= sum(poisoned) < len(records)
    assert [r["loss"] is None for r in records] == poisoned
    assert run.module.skipped_batches == sum(poisoned)
    for before, record in itertools.pairwise(records):
        if record["loss"] is None:  # no gradients: the optimizer leaves every weight as it was
            assert record["weights"] == before["weights"]
        else:
            assert record["weights"] != before["weights"]
    assert run.trainer.logged_metrics["train/skipped_batches"] == sum(poisoned)
    for name, param in run.module.model.named_parameters():
        finite = torch.isfinite(param)
        if name == "src_embed.weight":
            finite[rare] = True  # the poisoned row never takes part in an update
        assert finite.all(), name


# -- partial validation, final decoding ------------------------------------------------------------------


def test_partial_validation_trains_to_the_end_and_decodes_on_the_trainers_device(
    corpus: Path, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """limit_val_batches=1 validates a part of the 40 sentences: val/bleu is still logged for
    ModelCheckpoint and strict EarlyStopping, so training runs its 2 epochs and best.ckpt is scored."""
    overrides = tiny_overrides(
        corpus,
        tmp_path / "run",
        cache_dir,
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=1",
        "data.eval_max_tokens=200",  # several validation batches, of which one is validated
        "early_stopping.patience=5",
    )
    cfg = compose_train(overrides)
    run = build_fit(cfg)
    with caplog.at_level(logging.INFO, logger="app.training.module"):
        results = fit_and_evaluate(run, cfg)
    partial = [r.getMessage() for r in caplog.records if r.getMessage().startswith("val/bleu on the")]
    assert len(partial) == 2 and all(
        m.endswith(f"of {SLICE['val']} validation sentences decoded") for m in partial
    )
    assert results["epochs_completed"] == 2
    assert Path(results["checkpoint"]).name == "best.ckpt"
    assert "val/bleu" in run.trainer.callback_metrics
    assert results["test_decode_device"] == str(run.trainer.strategy.root_device)


# -- gradient accumulation ----------------------------------------------------------------------------------


class FirstStepGradients(pl.Callback):
    """Records the example ids of every training batch and the gradients of the first optimizer step
    (they are still there when the next step's ``zero_grad`` comes)."""

    def __init__(self) -> None:
        self.ids: list[list[int]] = []
        self.grads: dict[str, torch.Tensor] | None = None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx
    ) -> None:
        self.ids.append(batch.index.tolist())

    def on_before_zero_grad(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        params = dict(pl_module.model.named_parameters())
        if self.grads is None and all(p.grad is not None for p in params.values()):
            self.grads = {name: p.grad.clone() for name, p in params.items()}


def test_accumulated_step_has_the_gradient_of_one_big_batch(
    corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """Two micro-batches of different sizes give the gradient of their token-weighted mean loss."""
    cfg = tiny_config(
        corpus,
        cache_dir,
        tmp_path / "run",
        "trainer.accumulate_grad_batches=2",
        "trainer.max_steps=2",
        "trainer.limit_val_batches=0",
        "trainer.gradient_clip_val=null",
        "model.dropout=0.0",
    )
    run = build_fit(cfg)
    initial = deepcopy(run.module.model).train()
    recorder = FirstStepGradients()
    run.trainer.callbacks.append(recorder)
    run.trainer.fit(run.module, datamodule=run.datamodule)

    dataset, collate = run.datamodule.datasets["train"], run.datamodule.collate
    micro = [collate([dataset[i] for i in ids]) for ids in recorder.ids[:2]]
    assert micro[0].num_target_tokens != micro[1].num_target_tokens  # else a mean of means would pass too
    big = collate([dataset[i] for i in recorder.ids[0] + recorder.ids[1]])
    loss, _ = label_smoothed_nll(
        initial(big.src, big.tgt_in), big.tgt_out, epsilon=cfg.optim.label_smoothing, pad_id=big.pad_id
    )
    (loss / big.num_target_tokens).backward()
    assert recorder.grads is not None
    for name, param in initial.named_parameters():
        torch.testing.assert_close(recorder.grads[name], param.grad, rtol=1e-4, atol=1e-7, msg=name)


# -- optimizer ---------------------------------------------------------------------------------------------


def test_fused_adamw_updates_like_foreach(make_transformer: Callable[..., torch.nn.Module]) -> None:
    models = [make_transformer(seed=3).train() for _ in range(2)]
    settings = {
        "lr": 1e-2,
        "weight_decay": 0.01,
        "betas": (0.9, 0.98),
        "eps": 1e-9,
        "schedule": Schedule("inverse_sqrt", 1),
    }
    src, tgt = torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 8, 9]])
    for fused, model in zip((False, True), models, strict=True):
        optimizer, _ = build_optimizer(model, fused=fused, **settings)
        assert bool(optimizer.param_groups[0]["fused"]) is fused
        for _ in range(3):
            torch.manual_seed(0)
            model(src, tgt).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        if name.endswith("k_proj.bias"):
            # softmax ignores a key bias: its gradient is rounding noise, which Adam scales up to +-lr
            continue
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=name)  # 1% of one step (lr)


# -- checkpoint averaging --------------------------------------------------------------------------------

MODEL_CFG = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "d_ff": 64,
    "max_positions": 32,
}


@pytest.fixture
def two_checkpoints(checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path) -> list[Path]:
    paths = [tmp_path / "step-0000010.ckpt", tmp_path / "step-0000020.ckpt"]
    for seed, path in enumerate(paths):
        checkpoint_factory(path, model_cfg=MODEL_CFG, attention_cfg={"kernel": "eager"}, seed=seed)
    return paths


def test_averaging_identical_checkpoints_keeps_the_weights(
    two_checkpoints: list[Path], tmp_path: Path
) -> None:
    copies = [tmp_path / f"copy{i}.ckpt" for i in range(3)]
    for copy in copies:
        shutil.copy(two_checkpoints[0], copy)
    averaged = average_checkpoints(copies)["state_dict"]
    original = read_checkpoint(two_checkpoints[0])["state_dict"]
    assert averaged.keys() == original.keys()
    for name, value in original.items():
        assert torch.equal(averaged[name], value), name


def test_averaging_two_checkpoints_gives_their_mean(two_checkpoints: list[Path]) -> None:
    first, second = (read_checkpoint(p)["state_dict"] for p in two_checkpoints)
    averaged = average_checkpoints(two_checkpoints)["state_dict"]
    assert any(not torch.equal(first[n], second[n]) for n in first)
    for name in first:
        torch.testing.assert_close(averaged[name], (first[name] + second[name]) / 2, rtol=0, atol=1e-7)


def test_the_newest_step_checkpoints_of_a_directory_are_chosen(two_checkpoints: list[Path]) -> None:
    directory = two_checkpoints[0].parent
    newest = shutil.copy(two_checkpoints[0], directory / "step-0000100.ckpt")  # 100 > 20: newest by step
    (directory / "best.ckpt").write_bytes(b"")  # not a step checkpoint
    assert checkpoints_to_average([directory]) == [*two_checkpoints, newest]
    assert checkpoints_to_average([directory], last=2) == [two_checkpoints[1], newest]
    assert checkpoints_to_average(two_checkpoints[::-1]) == two_checkpoints[::-1]  # files: as given
    with pytest.raises(ValueError, match="--last must be >= 1, got 0"):
        checkpoints_to_average([directory], last=0)
    (directory / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no step-<step>\.ckpt in .*empty"):
        checkpoints_to_average([directory / "empty"])


def test_average_script_writes_a_translatable_checkpoint(two_checkpoints: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "avg.ckpt"
    command = [sys.executable, "scripts/average_checkpoints.py", str(tmp_path), "--last", "2", "-o", str(out)]
    result = subprocess.run(command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "averaged 2 checkpoints" in result.stdout
    expected = average_checkpoints(two_checkpoints)
    written = read_checkpoint(out)
    for name, value in expected["state_dict"].items():
        assert torch.equal(written["state_dict"][name], value), name
    translator, _ = load_torch_engine(out)
    assert len(translator.translate(["Ein Hund."], SearchSettings(beam=1, max_len=5))) == 1


def test_averaging_different_models_is_refused(
    checkpoint_factory: Callable[..., torch.nn.Module], two_checkpoints: list[Path], tmp_path: Path
) -> None:
    other = tmp_path / "other.ckpt"
    checkpoint_factory(other, model_cfg={**MODEL_CFG, "decoder_layers": 2}, attention_cfg={"kernel": "eager"})
    with pytest.raises(CheckpointError, match="holds different parameters"):
        average_checkpoints([two_checkpoints[0], other])


def test_nonfinite_loss_stop_reads_the_device_once_per_logged_step(
    corpus: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """``nonfinite_loss=stop`` checks the losses of the steps since the last check in one read: at a step
    whose metrics are written, or before a checkpoint. The error still names the first bad step and its
    batch, and no checkpoint holds weights a non-finite loss updated."""
    run_dir = tmp_path / "run"
    overrides = ("trainer.max_steps=6", "trainer.log_every_n_steps=4", "checkpoint.every_n_steps=2")
    run = build_fit(tiny_config(corpus, cache_dir, run_dir, *overrides, "trainer.limit_val_batches=0"))
    reads = DeviceReads()
    run.trainer.callbacks.append(reads)
    with torch.no_grad():
        run.module.model.encoder_norm.weight.fill_(math.nan)
    pattern = r"non-finite training loss \(nan\) at step 0 \(epoch 0\), batch of \d+ sentences"
    with reads.counting(), pytest.raises(NonFiniteLossError, match=pattern):
        run.trainer.fit(run.module, datamodule=run.datamodule)
    # steps 0 and 1 ran unchecked; the checkpoint after step 2's batch (global step 2) checked and stopped
    assert [len(b.sites) for b in reads.batches] == [0, 1]
    assert [site.split()[-2:] for site in reads.sites(reads.batches)] == [["first_nonfinite", "(tolist)"]]
    assert not list(run_dir.rglob("*.ckpt"))
