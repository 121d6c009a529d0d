"""Exact resume: the sampler's position and the random generators survive a checkpoint; a killed run
continues exactly like an uninterrupted one."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.training import (
    REPO_ROOT,
    read_trace,
    run_train,
    subprocess_env,
    tiny_overrides,
    train_command,
    write_corpus_slice,
)
from lightning_fabric.utilities.types import _Stateful
from torch.utils.data import TensorDataset

from app.checkpoint import read_checkpoint
from app.data.batching import TokenBucketBatchSampler
from app.data.datamodule import ResumableDataLoader
from app.training.callbacks import RngState, rng_states

LENGTHS = [(7 * i) % 23 + 1 for i in range(300)]


def sampler(**kwargs: int) -> TokenBucketBatchSampler:
    return TokenBucketBatchSampler(lengths=LENGTHS, max_tokens=60, seed=5, **kwargs)


@pytest.mark.parametrize("num_replicas", [1, 3])
def test_resumed_sampler_continues_after_the_consumed_batches(num_replicas: int) -> None:
    for rank in range(num_replicas):
        original = sampler(num_replicas=num_replicas, rank=rank)
        original.set_epoch(2)
        full = list(original)
        original.mark_consumed(4)
        state = original.state_dict()
        assert state["epoch"] == 2 and state["batches_consumed"] == 4

        resumed = sampler(num_replicas=num_replicas, rank=rank)
        resumed.set_epoch(2)  # the training loop's restored epoch
        resumed.load_state_dict(state)
        assert list(resumed) == full[4:]
        assert list(resumed) == full  # the skip applies once: the next pass over epoch 2 is whole again


def test_a_checkpoint_from_an_earlier_epoch_skips_nothing() -> None:
    """Written at the end of epoch 1, resumed by the loop in epoch 2: epoch 2's full order."""
    original = sampler()
    original.set_epoch(1)
    original.mark_consumed(len(original))
    resumed = sampler()
    resumed.set_epoch(2)
    resumed.load_state_dict(original.state_dict())
    expected = sampler()
    expected.set_epoch(2)
    assert list(resumed) == list(expected)


def test_a_different_batch_order_restarts_the_epoch_with_a_warning() -> None:
    original = sampler(num_replicas=2, rank=0)
    original.mark_consumed(3)
    resumed = sampler()  # one rank instead of two: the saved position means nothing here
    with pytest.warns(UserWarning, match=r"differs from this run's .*epoch 0 restarts at its first batch"):
        resumed.load_state_dict(original.state_dict())
    assert list(resumed) == list(sampler())


def test_a_new_epoch_resets_the_consumed_count() -> None:
    s = sampler()
    s.mark_consumed(5)
    s.set_epoch(0)
    assert s.state_dict()["batches_consumed"] == 5
    s.set_epoch(1)
    assert s.state_dict()["batches_consumed"] == 0


def test_lightning_sees_the_loader_as_stateful() -> None:
    batches = sampler()
    loader = ResumableDataLoader(TensorDataset(torch.arange(len(LENGTHS))), batch_sampler=batches)
    assert isinstance(loader, _Stateful)
    batches.mark_consumed(2)
    assert loader.state_dict() == batches.state_dict()
    other = sampler()
    ResumableDataLoader(TensorDataset(torch.arange(len(LENGTHS))), batch_sampler=other).load_state_dict(
        loader.state_dict()
    )
    assert list(other) == list(sampler())[2:]


def test_rng_state_round_trip() -> None:
    callback, checkpoint = RngState(seed=0), {}
    single = SimpleNamespace(world_size=1, global_rank=0)  # what the callback reads from the Trainer
    callback.on_save_checkpoint(single, None, checkpoint)
    first = (torch.rand(3), np.random.rand(3), random.random())
    callback.on_load_checkpoint(single, None, checkpoint)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1])
    assert first[2] == again[2]


def test_each_rank_restores_its_own_rng_state() -> None:
    """A checkpoint holds every rank's generators, in rank order; rank r resumes from entry r."""
    seeds = (11, 12)
    states = []
    for seed in seeds:
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        states.append(rng_states())
    for rank, seed in enumerate(seeds):
        trainer = SimpleNamespace(world_size=2, global_rank=rank)
        RngState(seed=0).on_load_checkpoint(trainer, None, {RngState.KEY: states})
        drawn = (torch.rand(3), np.random.rand(3), random.random())
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        assert torch.equal(drawn[0], torch.rand(3)), rank
        assert np.array_equal(drawn[1], np.random.rand(3)), rank
        assert drawn[2] == random.random(), rank


# -- kill -9 and resume, for real -------------------------------------------------------------------------

STEPS, EVERY = 30, 5  # about 16 batches per epoch: checkpoints at steps 5, 10, 15, 20 ... are mid-epoch


def kill_when_traced(command: list[str], trace: Path, batches: int, timeout: float = 300) -> None:
    """Start ``command``; SIGKILL it as soon as ``trace`` records ``batches`` training batches."""
    log = trace.with_suffix(".stderr")
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=stderr
        )
        deadline = time.monotonic() + timeout
        try:
            while not (trace.is_file() and len(trace.read_text().splitlines()) >= batches):
                assert process.poll() is None, f"training ended unkilled: {log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "training never reached the batch to kill it at"
                time.sleep(0.02)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()


@pytest.mark.slow
def test_killed_run_resumes_exactly(multi30k_dir: Path, tmp_path: Path) -> None:
    """The resumed run trains on the same batches (ids and the same sampled segmentations), with the same
    learning rates, losses, dropout stream and weights, step by step.

    Under subword sampling, so that one run checks everything a resume restores: the batch sampler's
    position, the loop's and the optimizer's state and every random generator (as a one-best run
    needs), and the per-batch segmentations drawn on top. Each run is three train.py processes, so the
    one-best case that checked the same restore without the segmentations was left out. The validation
    and test splits are short: they are decoded in every run and the trace compares training only.
    """
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 400, "val": 10, "test_2016_flickr": 5}
    )
    common = [
        f"trainer.max_steps={STEPS}",
        f"checkpoint.every_n_steps={EVERY}",
        "trainer.deterministic=true",
        "num_threads=1",
        "early_stopping.patience=0",
        "data.subword_sampling.nbest_size=8",
    ]

    def overrides(name: str) -> list[str]:
        run = tmp_path / name
        return tiny_overrides(corpus, run, tmp_path / "cache", *common, f"debug.trace_batches={run}.jsonl")

    run_train(overrides("uninterrupted"))
    kill_when_traced(train_command(overrides("killed")), tmp_path / "killed.jsonl", batches=23)
    saved = read_checkpoint(tmp_path / "killed" / "checkpoints" / "last.ckpt")
    position = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert 0 < position["batches_consumed"] < position["batches_per_epoch"], "not killed mid-epoch"
    run_train([*overrides("killed"), "resume=true"])

    expected = read_trace(tmp_path / "uninterrupted.jsonl")
    trace = read_trace(tmp_path / "killed.jsonl")
    restart = next(i for i in range(1, len(trace)) if trace[i]["step"] <= trace[i - 1]["step"])
    resumed = trace[restart:]
    assert resumed[0]["step"] == saved["global_step"] + 1
    assert resumed[0]["batch_idx"] == position["batches_consumed"]
    # the same steps, learning rates, batches, losses and (deterministic mode) weights after every step
    assert resumed == expected[saved["global_step"] :]
    final = [
        read_checkpoint(tmp_path / n / "checkpoints" / "last.ckpt")["state_dict"]
        for n in ("uninterrupted", "killed")
    ]
    assert final[0].keys() == final[1].keys()
    for name, value in final[0].items():
        assert torch.equal(value, final[1][name]), name
