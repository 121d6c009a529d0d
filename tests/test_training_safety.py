"""Failures a long run must survive or report clearly: bad checkpoints, non-finite losses; averaging."""

from __future__ import annotations

import itertools
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from training_helpers import REPO_ROOT, compose_train, read_trace, tiny_overrides, write_corpus_slice

from app.checkpoint import CheckpointError, average_checkpoints, load_translator, read_checkpoint
from app.lit_module import NonFiniteLossError
from app.optim import build_optimizer
from app.training import build_run, train
from app.translator import SearchSettings

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
    assert train(cfg)["global_step"] == 2


# -- non-finite losses -----------------------------------------------------------------------------------


def test_nonfinite_loss_stops_with_step_and_batch_size(corpus: Path, cache_dir: Path, tmp_path: Path) -> None:
    run = build_run(tiny_config(corpus, cache_dir, tmp_path / "run", "trainer.max_steps=3"))
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
    run = build_run(cfg)
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


# -- optimizer ---------------------------------------------------------------------------------------------


def test_fused_adamw_updates_like_foreach(make_transformer: Callable[..., torch.nn.Module]) -> None:
    models = [make_transformer(seed=3).train() for _ in range(2)]
    settings = {"lr": 1e-2, "weight_decay": 0.01, "betas": (0.9, 0.98), "eps": 1e-9, "warmup": 1}
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


def test_average_script_writes_a_translatable_checkpoint(two_checkpoints: list[Path], tmp_path: Path) -> None:
    from importlib import util

    path = REPO_ROOT / "scripts" / "average_checkpoints.py"
    spec = util.spec_from_file_location("average_checkpoints", path)
    script = util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shutil.copy(two_checkpoints[0], two_checkpoints[0].with_name("step-0000030.ckpt"))  # newest by step
    out = tmp_path / "avg.ckpt"
    assert script.main([str(tmp_path), "--last", "2", "-o", str(out)]) == 0
    expected = average_checkpoints([two_checkpoints[1], two_checkpoints[0].with_name("step-0000030.ckpt")])
    written = read_checkpoint(out)
    for name, value in expected["state_dict"].items():
        assert torch.equal(written["state_dict"][name], value), name
    translator, _ = load_translator(out)
    assert len(translator.translate(["Ein Hund."], SearchSettings(beam=1, max_len=5))) == 1
    assert script.main([str(tmp_path / "nothing-here"), "-o", str(out)]) == 1


def test_averaging_different_models_is_refused(
    checkpoint_factory: Callable[..., torch.nn.Module], two_checkpoints: list[Path], tmp_path: Path
) -> None:
    other = tmp_path / "other.ckpt"
    checkpoint_factory(other, model_cfg={**MODEL_CFG, "decoder_layers": 2}, attention_cfg={"kernel": "eager"})
    with pytest.raises(CheckpointError, match="holds different parameters"):
        average_checkpoints([two_checkpoints[0], other])
