"""experiment=ablation_length_finetune: each job starts from the data.concat=1 checkpoint of the same
attention and seed in a scratch sweep. The config resolves that path in a Hydra job, names its job dirs
as the scratch sweep does, repeats the scratch experiment's settings, and a missing or unsuitable start
checkpoint stops the job with a message naming it. The slow test runs both arms for a few steps and
reports them apart."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.configs import compose_config
from helpers.models import TINY_TRANSFORMER
from helpers.training import run_train, tiny_overrides, write_corpus_slice
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from app.checkpoint import CheckpointError
from app.reports.report import write_report
from app.training.task import check_mandatory_keys
from app.training.warm_start import load_start

FINETUNE = "experiment=ablation_length_finetune"
SCRATCH = "/sweeps/scratch"


def resolved_init_from(tmp_path: Path, *overrides: str) -> tuple[str, str]:
    """init_from as a job of the fine-tune sweep resolves it, and the job's directory name."""
    cfg = compose_config(FINETUNE, f"from_sweep={SCRATCH}", *overrides, tmp_path=tmp_path, hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # what Hydra does for every job it runs
    try:
        return cfg.init_from, cfg.hydra.job.override_dirname
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.parametrize(("attention", "seed"), [("eager", 1), ("long_mix", 3)])
def test_each_job_starts_from_its_attention_and_seed_at_one_pair(
    tmp_path: Path, attention: str, seed: int
) -> None:
    init_from, _ = resolved_init_from(tmp_path, f"attention={attention}", "data.concat=16", f"seed={seed}")
    assert init_from == f"{SCRATCH}/attention={attention},data.concat=1,seed={seed}/checkpoints/best.ckpt"


def test_job_dirs_are_named_as_the_scratch_sweeps_are(tmp_path: Path) -> None:
    """from_sweep is left out of the names (conf/sweep/ablation.yaml), so both arms share a layout and the
    path init_from builds is the scratch job's own name."""
    job = ["attention=sparse", "data.concat=1", "seed=2", "resume=true"]
    scratch = compose_config("experiment=ablation_length", *job, tmp_path=tmp_path, hydra_config=True)
    init_from, finetune_dir = resolved_init_from(tmp_path, *job)
    assert finetune_dir == scratch.hydra.job.override_dirname
    name = finetune_dir.replace(f",output_dir={tmp_path}", "")  # the tests' own override, not a sweep's
    assert name == "attention=sparse,data.concat=1,seed=2"
    assert init_from == f"{SCRATCH}/{name}/checkpoints/best.ckpt"


def test_the_fine_tune_arm_repeats_the_scratch_arms_settings(tmp_path: Path) -> None:
    """Experiments extend one level only, so ablation_length_finetune repeats ablation_length: they agree
    on everything but where the weights start, and their reports time decoding alike."""
    scratch = compose_config("experiment=ablation_length", tmp_path=tmp_path, hydra_config=True)
    finetune = compose_config(FINETUNE, f"from_sweep={SCRATCH}", tmp_path=tmp_path, hydra_config=True)
    ours, theirs = (OmegaConf.to_container(cfg, resolve=False) for cfg in (scratch, finetune))
    assert isinstance(ours, dict) and isinstance(theirs, dict)
    hydra_ours, hydra_theirs = ours.pop("hydra"), theirs.pop("hydra")
    assert ours.pop("init_from") is None and theirs.pop("init_from").startswith("${from_sweep}/")
    assert theirs.pop("from_sweep") == SCRATCH
    assert theirs == ours
    assert hydra_theirs["callbacks"] == hydra_ours["callbacks"]  # the report's bounded decode timing
    assert hydra_theirs["job"]["config"] == hydra_ours["job"]["config"]  # job dir names


def test_a_fine_tune_sweep_needs_its_source_sweep(tmp_path: Path) -> None:
    cfg = compose_config(FINETUNE, tmp_path=tmp_path)
    with pytest.raises(ValueError, match=r"mandatory config value\(s\) not set: from_sweep"):
        check_mandatory_keys(cfg)


def test_a_missing_start_checkpoint_names_the_path_and_the_job_it_should_come_from(tmp_path: Path) -> None:
    path = f"{tmp_path}/attention=eager,data.concat=1,seed=1/checkpoints/best.ckpt"
    with pytest.raises(CheckpointError) as refused:
        load_start(path, {"from_sweep": str(tmp_path), "data": {"concat": 4}})
    message = str(refused.value)
    assert message.startswith(f"init_from={path}: no such checkpoint")
    assert f"data.concat=1 in from_sweep={tmp_path}" in message and "make ablation-length" in message
    with pytest.raises(CheckpointError, match=re.escape(f"init_from={path}: no such checkpoint")):
        load_start(path, {})


def test_joined_examples_need_a_start_whose_tokenizer_has_the_separator(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    """The test tokenizer was trained without <sep>: fine for single sentences, refused for K > 1."""
    path = tmp_path / "best.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    load_start(str(path), {"data": {"concat": 1}})
    with pytest.raises(CheckpointError, match=r"no <sep> piece, which data.concat=4 joins sentences with"):
        load_start(str(path), {"data": {"concat": 4}})


@pytest.mark.slow
def test_a_fine_tune_sweep_starts_each_job_from_the_scratch_job_and_reports_apart(
    multi30k_dir: Path, tmp_path: Path
) -> None:
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "corpus", {"train": 400, "val": 20, "test_2016_flickr": 12}
    )
    scratch, finetune = tmp_path / "scratch", tmp_path / "finetune"
    tiny = [
        *tiny_overrides(corpus, tmp_path / "unused", tmp_path / "cache"),
        "model.max_positions=200",
        "data.max_len=150",
        "valid_search.max_len=100",
        "test_search.max_len=100",
        "trainer.max_time=null",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
    ]
    fixed = [o for o in tiny if not o.startswith(("output_dir=", "hydra.run.dir="))]
    # the scratch arm's eager job at one pair, where a sweep would have written it
    job = f"hydra.run.dir='{scratch}/attention=eager,data.concat=1,seed=1'"  # quoted: '=' and ','
    run_train(["experiment=ablation_length", *fixed, "attention=eager", "data.concat=1", "seed=1", job])
    exclude = ["experiment", "resume", "hydra.sweep.dir", "from_sweep", *(o.split("=", 1)[0] for o in fixed)]
    done = run_train(
        [
            "-m",
            FINETUNE,
            f"from_sweep={scratch}",
            *fixed,
            f"hydra.sweep.dir={finetune}",
            f"hydra.job.config.override_dirname.exclude_keys=[{','.join(exclude)}]",
            "attention=eager,sdpa",  # sdpa has no scratch job: that job fails, naming the checkpoint
            "data.concat=2",
            "seed=1",
        ],
        timeout=600,
        check=False,
    )
    assert done.returncode == 1  # the sdpa job failed: the sweep went on, then said so on its last line
    assert done.stderr.strip().splitlines()[-1].endswith(": attention=sdpa,data.concat=2,seed=1")
    eager = finetune / "attention=eager,data.concat=2,seed=1"
    assert json.loads((eager / "results.json").read_text())["global_step"] == 3
    assert (
        f"init_from={scratch}/attention=eager,data.concat=1,seed=1/checkpoints/best.ckpt"
        in (eager / "train.log").read_text()
    )
    failed = (finetune / "attention=sdpa,data.concat=2,seed=1" / "FAILED").read_text()
    assert f"init_from={scratch}/attention=sdpa,data.concat=1,seed=1/checkpoints/best.ckpt: no such" in failed

    write_report([scratch, finetune], tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Group 2" in text and "- start: fine-tuned" in text.split("## Group 2")[1]
    assert "- start:" not in text.split("## Group 2")[0]  # the scratch group
