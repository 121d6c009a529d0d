"""The distributed path: rank helpers, and a real 2-process DDP run on CPU (``trainer=ddp_cpu``, gloo)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from helpers.training import compose_train, read_trace, run_train, tiny_overrides, write_corpus_slice

from app.ranks import launched_as_local_zero, launched_as_rank_zero
from app.training.callbacks import SameRunDirectory
from app.training.distributed import gather_objects, rank_zero_log_file, register_resolvers
from app.training.task import build_fit

RANK_ENV = ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK", "SLURM_LOCALID")


@pytest.fixture
def clean_rank_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "rank_zero", "local_zero"),
    [
        ({}, True, True),  # a plain run, or the process Lightning's launcher starts the others from
        ({"LOCAL_RANK": "1"}, False, False),  # a process Lightning's launcher started
        ({"RANK": "0", "LOCAL_RANK": "0"}, True, True),  # torchrun, first process
        ({"RANK": "4", "LOCAL_RANK": "0"}, False, True),  # torchrun, first process of the second node
        ({"SLURM_PROCID": "3", "SLURM_LOCALID": "1"}, False, False),
        ({"NODE_RANK": "1"}, False, True),  # Lightning's launcher on the second node
    ],
)
def test_rank_from_the_launchers_environment(
    clean_rank_env: pytest.MonkeyPatch, env: dict[str, str], rank_zero: bool, local_zero: bool
) -> None:
    for name, value in env.items():
        clean_rank_env.setenv(name, value)
    assert launched_as_rank_zero() is rank_zero
    assert launched_as_local_zero() is local_zero
    assert rank_zero_log_file("/runs/x") == ("/runs/x/train.log" if rank_zero else os.devnull)


def test_only_rank_zero_gets_the_log_file_and_hydra_folder(
    clean_rank_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    register_resolvers()
    overrides = [f"output_dir={tmp_path}", f"hydra.run.dir={tmp_path}"]

    def hydra_settings() -> tuple[str, str | None]:
        from helpers.training import REPO_ROOT
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
        cfg.hydra.runtime.output_dir = str(tmp_path)
        cfg.hydra.job.name = "train"  # what train.py's Hydra sets (compose() calls the job after its caller)
        return cfg.hydra.job_logging.handlers.file.filename, cfg.hydra.output_subdir

    assert hydra_settings() == (str(tmp_path / "train.log"), ".hydra")
    clean_rank_env.setenv("LOCAL_RANK", "1")
    assert hydra_settings() == (os.devnull, None)


def test_gather_outside_a_process_group_is_the_object_itself() -> None:
    assert gather_objects({3: [1, 2]}) == [{3: [1, 2]}]
    SameRunDirectory("/runs/x").setup(None, None, "fit")  # one process: nothing to disagree with


# -- a real two-process run ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ddp_run(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``trainer=ddp_cpu``: 2 processes, 12 steps (8 per epoch), validation after the first epoch."""
    base = tmp_path_factory.mktemp("ddp")
    corpus = write_corpus_slice(
        multi30k_dir, base / "m30k", {"train": 400, "val": 60, "test_2016_flickr": 20}
    )
    run_dir, trace = base / "run", base / "trace.jsonl"
    overrides = tiny_overrides(
        corpus,
        run_dir,
        base / "cache",
        "trainer=ddp_cpu",
        "trainer.max_steps=12",
        "early_stopping.patience=0",
        f"debug.trace_batches={trace}",
    )
    run_train(overrides, timeout=600)
    return {
        "run_dir": run_dir,
        "trace": trace,
        "corpus": corpus,
        "cache": base / "cache",
        "overrides": overrides,
    }


@pytest.mark.slow
def test_ddp_ranks_stay_identical_and_share_every_epoch(ddp_run: dict) -> None:
    ranks = [read_trace(ddp_run["trace"]), read_trace(Path(f"{ddp_run['trace']}.rank1"))]
    assert [len(r) for r in ranks] == [12, 12]
    for step0, step1 in zip(*ranks, strict=True):
        assert (step0["step"], step0["lr"], step0["loss"]) == (step1["step"], step1["lr"], step1["loss"])
        assert step0["weights"] == step1["weights"], f"weights differ after step {step0['step']}"
        assert not set(step0["ids"]) & set(step1["ids"])
    first_epoch = [i for rank in ranks for record in rank if record["epoch"] == 0 for i in record["ids"]]
    assert len(first_epoch) == len(set(first_epoch))  # no example twice
    assert set(first_epoch) == set(range(len(first_epoch)))  # every kept training example once
    assert len(first_epoch) >= 390  # 400 lines, a few dropped as empty or too long
    assert {r["epoch"] for r in ranks[0]} == {0, 1}


@pytest.mark.slow
def test_ddp_ranks_draw_different_dropout_masks_from_one_batch_order(ddp_run: dict) -> None:
    """Ranks are seeded seed + rank (their generators differ at every step) while the batch sampler,
    seeded alike on both, still deals each rank its share of one order (checked above: no overlap)."""
    ranks = [read_trace(ddp_run["trace"]), read_trace(Path(f"{ddp_run['trace']}.rank1"))]
    for step0, step1 in zip(*ranks, strict=True):
        assert step0["rng"] != step1["rng"], f"same dropout stream at step {step0['step']}"
        assert step0["weights"] == step1["weights"]


@pytest.mark.slow
def test_ddp_writes_one_run_directory(ddp_run: dict) -> None:
    run_dir = ddp_run["run_dir"]
    assert sorted(p.name for p in run_dir.iterdir()) == [
        ".hydra",
        "checkpoints",
        "csv",
        "results.json",
        "test.hyp",
        "train.log",
    ]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert [p.name for p in (run_dir / "csv").iterdir()] == ["metrics.csv"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_step"] == 12
    assert not list(run_dir.parent.glob("**/train_ddp_process_*"))


@pytest.mark.slow
def test_ddp_validation_equals_a_single_process_validation(ddp_run: dict, tmp_path: Path) -> None:
    """Loss summed over ranks' tokens and BLEU over gathered hypotheses: the single-process values."""
    with (ddp_run["run_dir"] / "csv" / "metrics.csv").open() as handle:
        logged = [row for row in csv.DictReader(handle) if row.get("val/bleu")]
    assert len(logged) == 1  # after epoch 0 (8 steps); training stopped at step 12
    skip = ("trainer=ddp_cpu", "debug.", "output_dir=", "hydra.")
    overrides = [o for o in ddp_run["overrides"] if not o.startswith(skip)]
    run = build_fit(compose_train([*overrides, f"output_dir={tmp_path}", "logger.kind=null"]))
    run.trainer.validate(
        run.module, datamodule=run.datamodule, ckpt_path=str(ddp_run["run_dir"] / "checkpoints" / "best.ckpt")
    )
    single = run.trainer.callback_metrics
    assert float(single["val/bleu"]) == pytest.approx(float(logged[0]["val/bleu"]), abs=1e-6)
    assert float(single["val/chrf"]) == pytest.approx(float(logged[0]["val/chrf"]), abs=1e-6)  # > 0 here
    assert float(single["val/loss"]) == pytest.approx(float(logged[0]["val/loss"]), rel=1e-6)
    assert float(single["val/nll"]) == pytest.approx(float(logged[0]["val/nll"]), rel=1e-6)
