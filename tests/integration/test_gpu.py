"""GPU-only paths, exercised when a GPU is present (skipped elsewhere, with the reason)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.training import compose_train, run_train, tiny_overrides, write_corpus_slice

from app.training.task import train

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SLICE = {"train": 400, "val": 40, "test_2016_flickr": 20}


@pytest.fixture(scope="module")
def corpus(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus_slice(multi30k_dir, tmp_path_factory.mktemp("m30k"), SLICE)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_short_gpu_training_with_fused_adamw_and_clipping(
    corpus: Path, tmp_path: Path, precision: str
) -> None:
    """16-mixed: the gradient scaler plus a fused optimizer, clipped after explicit unscaling."""
    overrides = tiny_overrides(corpus, tmp_path / "run", tmp_path / "cache", "trainer.max_steps=20")
    overrides = [o for o in overrides if not o.startswith(("trainer.accelerator", "trainer.precision"))]
    cfg = compose_train(
        [*overrides, "trainer.accelerator=gpu", "trainer.devices=1", f"trainer.precision={precision}"]
    )
    results = train(cfg)
    assert results["global_step"] == 20
    assert results["skipped_batches"] == 0
    assert results["test_decode_device"].startswith("cuda")  # the test set is decoded on the GPU too


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_on_two_gpus(corpus: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(corpus, run_dir, tmp_path / "cache", "trainer=ddp", "trainer.devices=2")
    overrides = [o for o in overrides if not o.startswith(("trainer.accelerator", "trainer.precision"))]
    run_train([*overrides, "trainer.max_steps=10"])
    assert json.loads((tmp_path / "run" / "results.json").read_text())["world_size"] == 2


def test_training_benchmark_on_the_gpu_counts_flops_and_measures_the_gpus_peak(
    corpus: Path, tmp_path: Path
) -> None:
    """scripts/bench_train.py on CUDA: FLOPs are counted from lengths that live on the GPU, and MFU
    divides by the GPU's own bf16 peak (hundreds of TFLOP/s), not the host CPU's."""
    from app.bench.training import measure

    overrides = tiny_overrides(corpus, tmp_path / "run", tmp_path / "cache")
    overrides = [o for o in overrides if not o.startswith(("trainer.accelerator", "trainer.precision"))]
    overrides = [o for o in overrides if not o.startswith(("output_dir", "hydra.run.dir"))]
    result = measure([*overrides, "trainer.accelerator=gpu", "trainer.devices=1"], 3, 2, 3)
    assert result["device"] == torch.cuda.get_device_name()
    assert result["model_tflops"] > 0 and 0 < result["mfu"] < 1
    assert result["peak_bf16_tflops"] > 20  # a data-centre GPU; a 2-core CPU reaches ~0.3-3
    assert result["peak_cuda_mb"] > 0
