"""experiment=ablation_uptrain: its two arms (conf/arm) start and budget their jobs as the ablation needs,
and name the job dirs by arm, attention, heads and seed only, so a resumed sweep finds them."""

from __future__ import annotations

from pathlib import Path

from helpers.configs import compose_config
from hydra.core.hydra_config import HydraConfig

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
