"""app.training.recipes: the quickstart recipe chosen from given measurements (no timing here), what is
measured where, the command train.py gets, recipe.json; and the fp32 recipe composes as it says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.configs import compose_config

import app.hardware
from app.training import recipes
from app.training.recipes import (
    BF16_RECIPE,
    FP32_RECIPE,
    MIN_BF16_SPEEDUP,
    MatmulPeaks,
    choose_recipe,
    forced_recipe,
    measure_matmul,
    run_training,
    split_run_dir,
    train_command,
    write_choice,
)


def cpu(fast_bf16: bool, bf16: float | None, fp32: float) -> MatmulPeaks:
    return MatmulPeaks(device="cpu", on_gpu=False, fast_bf16=fast_bf16, bf16_tflops=bf16, fp32_tflops=fp32)


def test_fast_bf16_well_above_fp32_chooses_the_bf16_recipe() -> None:
    choice = choose_recipe(cpu(True, 0.95, 0.21))
    assert choice.experiment == BF16_RECIPE == "quickstart"
    assert choice.reason == "bf16 0.95 TFLOP/s vs fp32 0.21 (4.5x >= 1.5x): experiment=quickstart"


def test_no_native_bf16_chooses_the_fp32_recipe() -> None:
    choice = choose_recipe(cpu(False, None, 0.11))
    assert choice.experiment == FP32_RECIPE == "quickstart_fp32"
    assert "no native bf16" in choice.reason and "avx512_bf16" in choice.reason
    assert "fp32 0.11 TFLOP/s" in choice.reason and choice.reason.endswith("experiment=quickstart_fp32")


def test_native_bf16_that_measures_barely_faster_chooses_the_fp32_recipe() -> None:
    choice = choose_recipe(cpu(True, 0.25, 0.21))
    assert choice.experiment == FP32_RECIPE
    assert choice.reason == "bf16 0.25 TFLOP/s vs fp32 0.21 (1.2x < 1.5x): experiment=quickstart_fp32"


def test_the_threshold_is_inclusive_and_can_be_given() -> None:
    assert choose_recipe(cpu(True, 0.3 * MIN_BF16_SPEEDUP, 0.3)).experiment == BF16_RECIPE
    assert choose_recipe(cpu(True, 0.95, 0.21), min_speedup=5.0).experiment == FP32_RECIPE


def test_a_gpu_with_native_bf16_chooses_the_bf16_recipe() -> None:
    gpu = MatmulPeaks(device="NVIDIA H100", on_gpu=True, fast_bf16=True, bf16_tflops=None, fp32_tflops=None)
    choice = choose_recipe(gpu)
    assert choice.experiment == BF16_RECIPE and "NVIDIA H100" in choice.reason


def test_a_gpu_that_only_emulates_bf16_chooses_the_fp32_recipe() -> None:
    gpu = MatmulPeaks(device="Tesla V100", on_gpu=True, fast_bf16=False, bf16_tflops=None, fp32_tflops=None)
    choice = choose_recipe(gpu)
    assert choice.experiment == FP32_RECIPE and "Tesla V100" in choice.reason and "emulated" in choice.reason


def test_a_forced_recipe_is_checked() -> None:
    assert forced_recipe(FP32_RECIPE).experiment == FP32_RECIPE
    assert forced_recipe(FP32_RECIPE).peaks is None
    with pytest.raises(ValueError, match=r"'fp16'.*quickstart, quickstart_fp32"):
        forced_recipe("fp16")


def test_a_cpu_without_native_bf16_runs_no_bf16_product(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(app.hardware, "cpu_flags", lambda cpuinfo=None: frozenset({"sse2", "avx2", "fma"}))
    dtypes: list[torch.dtype] = []
    matmul = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: dtypes.append(a.dtype) or matmul(a, b))
    peaks = measure_matmul(size=32, repeats=1)
    assert (peaks.fast_bf16, peaks.bf16_tflops) == (False, None) and peaks.fp32_tflops > 0
    assert set(dtypes) == {torch.float32}
    assert choose_recipe(peaks).experiment == FP32_RECIPE


def test_on_a_gpu_nothing_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(recipes, "matmul_peak_tflops", lambda *a, **k: pytest.fail("measured on a GPU"))
    peaks = measure_matmul()
    assert peaks.on_gpu and peaks.device == "Some GPU"
    assert choose_recipe(peaks).experiment == BF16_RECIPE


def test_the_run_directory_is_taken_out_of_the_overrides() -> None:
    run_dir, rest = split_run_dir(["trainer.max_steps=2", "hydra.run.dir='runs/a b'", "seed=3"])
    assert run_dir == Path("runs/a b") and rest == ["trainer.max_steps=2", "seed=3"]
    default, rest = split_run_dir(["seed=3"])
    assert default.parts[0] == "outputs" and rest == ["seed=3"]  # train.py's default, made concrete


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("experiment=quickstart", "chosen here.*--recipe"),
        ("+experiment=quickstart", "chosen here"),
        ("hydra.run.dir=out/${now:%H}", "plain path"),
        ("trainer.max_steps=[1", "bad train.py override"),
    ],
)
def test_overrides_it_cannot_pass_on_are_refused(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_run_dir([override])


def test_the_command_trains_the_choice_in_the_run_directory(tmp_path: Path) -> None:
    command = train_command(forced_recipe(FP32_RECIPE), ["seed=3"], tmp_path / "run")
    assert command[1].endswith("train.py")
    assert command[2:] == ["experiment=quickstart_fp32", "seed=3", f"hydra.run.dir='{tmp_path / 'run'}'"]


def test_the_choice_is_written_into_the_run(tmp_path: Path) -> None:
    choice = choose_recipe(cpu(True, 0.25, 0.21))
    path = write_choice(choice, tmp_path / "run")
    assert path == tmp_path / "run" / "recipe.json"
    written = json.loads(path.read_text())
    assert written["experiment"] == FP32_RECIPE and written["reason"] == choice.reason
    assert written["peaks"]["bf16_tflops"] == 0.25 and written["forced"] is False
    assert [p.name for p in path.parent.iterdir()] == ["recipe.json"]  # no temporary left


def test_the_exit_status_is_the_childs() -> None:
    assert run_training(["python3", "-c", "import sys; sys.exit(3)"]) == 3
    assert run_training(["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]) == 143


def test_the_fp32_recipe_composes_as_it_says(tmp_path: Path) -> None:
    cfg = compose_config(f"experiment={FP32_RECIPE}", tmp_path=tmp_path, hydra_config=True)
    assert cfg.hydra.runtime.choices["model"] == "transformer_tiny"
    assert cfg.hydra.runtime.choices["attention"] == "eager"
    assert (cfg.model.d_model, cfg.model.encoder_layers, cfg.model.d_ff) == (128, 4, 256)
    assert cfg.trainer.precision == "32-true"
    assert (cfg.optim.schedule, cfg.optim.decay_steps) == ("cosine", "auto")
    assert cfg.trainer.max_time == "00:00:08:00"
    bf16 = compose_config(f"experiment={BF16_RECIPE}", tmp_path=tmp_path)
    assert (bf16.trainer.precision, bf16.data.src_lang, bf16.data.tgt_lang) == ("auto", "de", "en")
    assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("de", "en")  # the same task
