"""No training step waits for the device unless its metrics are written (issue 48: a busy GPU).

On a GPU every ``.item()``, ``bool()``, ``int()``, ``float()`` or ``.tolist()`` of a device tensor stalls
Python until the queued kernels have run. :class:`helpers.device_reads.DeviceReads` counts them per batch
of a real CPU run: with the default trainer options (progress bar on, ``nonfinite_loss=stop``, norm
clipping) a batch whose step metrics are not written reads nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.device_reads import DeviceReads
from helpers.training import compose_train, tiny_overrides, write_corpus_slice

from app.bench.runs import StepClock
from app.training.task import build_fit

# At a written step: Lightning's .item() of train/loss, train/nll and train/tokens_per_s, the module's one
# .tolist() of the unchecked losses (nonfinite_loss=stop) and one float() of the loss for the progress bar.
READS_AT_A_WRITTEN_STEP = 5
SLICE = {"train": 200, "val": 20, "test_2016_flickr": 10}


@pytest.fixture(scope="module")
def corpus(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k"), SLICE)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_steps_that_write_no_metrics_read_nothing_from_the_device(
    corpus: Path, tmp_path: Path, layout: str
) -> None:
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(
        corpus,
        run_dir,
        tmp_path / "cache",
        f"data.layout={layout}",
        "trainer.max_steps=6",
        "trainer.log_every_n_steps=3",
        "trainer.enable_progress_bar=true",  # the default: the bar is drawn after every batch
        "trainer.limit_val_batches=0",
        "evaluate_test=false",
    )
    run = build_fit(compose_train(overrides))
    reads, clock = DeviceReads(), StepClock()  # the benchmark's clock too: it counts FLOPs once, at the end
    run.trainer.callbacks.extend([reads, clock])
    with reads.counting():
        run.trainer.fit(run.module, datamodule=run.datamodule)
    assert len(clock.flops) == 6 and min(clock.flops) > 0

    assert [b.writes_logs for b in reads.batches] == [False, False, True] * 2
    assert reads.sites(reads.silent_batches()) == {}
    for batch in reads.batches:
        assert len(batch.sites) <= READS_AT_A_WRITTEN_STEP, batch.sites
