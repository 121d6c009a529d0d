"""experiment=ablation_uptrain: its two arms (conf/arm) start and budget their jobs as the ablation needs,
and name the job dirs by arm, attention, heads and seed only, so a resumed sweep finds them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.configs import compose_config
from helpers.models import TINY_TRANSFORMER
from hydra.core.hydra_config import HydraConfig
from omegaconf.errors import InterpolationResolutionError

from app.training.distributed import register_resolvers
from app.training.task import train_or_exit

BUDGET = ["uptrain.base=/runs/base/checkpoints/best.ckpt", "uptrain.steps=40", "uptrain.total_steps=440"]


def test_the_arms_start_and_budget_their_jobs(tmp_path: Path) -> None:
    jobs = {}
    for arm in ("converted", "scratch"):
        overrides = [
            "experiment=ablation_uptrain",
            f"arm={arm}",
            *BUDGET,
            "heads=mqa",
            "seed=2",
            "resume=true",
        ]
        cfg = compose_config(*overrides, tmp_path=tmp_path, hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # what Hydra does for every job it runs
        try:
            jobs[arm] = cfg
            name = cfg.hydra.job.override_dirname.replace(f",output_dir={tmp_path}", "")
            assert name == f"arm={arm},heads=mqa,seed=2"  # the budgets and the base are not in the names
        finally:
            HydraConfig.instance().cfg = None
    converted, scratch = jobs["converted"], jobs["scratch"]
    assert converted.init_from == "/runs/base/checkpoints/best.ckpt" and scratch.init_from is None
    assert (converted.trainer.max_steps, scratch.trainer.max_steps) == (40, 440)  # X, and B + X
    assert converted.trainer.val_check_interval == 40 and converted.checkpoint.every_n_steps == 40
    assert (converted.optim.warmup_steps, scratch.optim.warmup_steps) == (20, 150)  # the quickstart's
    assert scratch.trainer.max_time is None and scratch.early_stopping.patience == 0
    assert converted.attention.num_kv_heads == scratch.attention.num_kv_heads == 1


def test_the_converted_arm_goes_on_at_the_base_s_last_learning_rate(
    tmp_path: Path, checkpoint_factory: Callable[..., torch.nn.Module]
) -> None:
    """Uptraining starts from the rate the base stopped at (its checkpoint's scheduler), not the recipe's
    peak; the scratch arm keeps the recipe's. A base without scheduler state is named, with the way out."""
    base = tmp_path / "base.ckpt"
    checkpoint_factory(base, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    trained = torch.load(base, weights_only=True)
    torch.save({**trained, "lr_schedulers": [{"_last_lr": [7.07e-4, 7.07e-4]}]}, base)
    register_resolvers()
    budget = [f"uptrain.base={base}", "uptrain.steps=40", "uptrain.total_steps=440"]
    rates = {
        arm: compose_config("experiment=ablation_uptrain", f"arm={arm}", *budget, tmp_path=tmp_path).optim.lr
        for arm in ("converted", "scratch")
    }
    assert rates == {"converted": 7.07e-4, "scratch": 2.0e-3}
    given = compose_config("experiment=ablation_uptrain", *budget, "uptrain.lr=1e-4", tmp_path=tmp_path)
    assert given.optim.lr == 1e-4

    torch.save(trained, base)  # no scheduler state (an averaged checkpoint, say)
    bare = compose_config("experiment=ablation_uptrain", "arm=converted", *budget, tmp_path=tmp_path)
    with pytest.raises(InterpolationResolutionError, match="no learning-rate scheduler state"):
        _ = bare.optim.lr


def test_a_missing_base_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    register_resolvers()
    base = tmp_path / "none.ckpt"
    cfg = compose_config(
        "experiment=ablation_uptrain",
        f"uptrain.base={base}",
        "uptrain.steps=1",
        "uptrain.total_steps=2",
        tmp_path=tmp_path,
    )
    with pytest.raises(SystemExit) as exit_:
        train_or_exit(cfg)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: optim.lr: checkpoint not found: {base}"
