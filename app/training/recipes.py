"""Which quickstart recipe this machine trains best: ``quickstart`` (bf16) or ``quickstart_fp32``.

``make demo`` runs ``scripts/quickstart.py``, which measures (:func:`measure_matmul`), chooses
(:func:`choose_recipe`, pure: unit-tested with given numbers) and trains ``train.py experiment=<choice>``
as a child process (:func:`split_run_dir`, :func:`train_command`, :func:`run_training`). The choice,
its reason and the numbers behind it go to ``<run dir>/recipe.json`` before training starts
(:func:`write_choice`).

Whether bf16 is native here is :func:`app.hardware.fast_bf16`'s answer, the rule ``precision=auto`` follows
too; on a CPU, a measured speed-up must back it, because the bf16 recipe's model is larger:

- On a GPU with native bf16: ``quickstart`` (its ``trainer.precision=auto`` resolves to bf16-mixed).
- On a CPU with native bf16 whose measured bf16 product runs at least :data:`MIN_BF16_SPEEDUP` times the
  fp32 one: ``quickstart``.
- Otherwise (no native bf16, or too small a measured gain): ``quickstart_fp32``, a smaller model at fp32.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from app.hardware import FAST_BF16_FLAGS, fast_bf16, matmul_peak_tflops
from app.io import atomic_write
from app.rundir import RunDir
from app.training.train_process import run_train_process, single_run_command

BF16_RECIPE = "quickstart"  # conf/experiment/quickstart.yaml: transformer_small, precision auto (bf16)
FP32_RECIPE = "quickstart_fp32"  # conf/experiment/quickstart_fp32.yaml: transformer_tiny, 32-true
RECIPES = (BF16_RECIPE, FP32_RECIPE)

# The bf16 recipe is chosen only where a bf16 matrix product runs at least this many times as fast as an
# fp32 one. Autocast adds casts and keeps fp32 master weights, so a bf16 kernel that is barely faster than
# fp32 does not make training faster, and the bf16 recipe's larger model needs the speed-up to train
# enough steps in its 8 minutes. A margin for measurement noise, to be tuned from measured runs.
MIN_BF16_SPEEDUP = 1.5
PEAK_SIZE = 1024  # side of the measured square products: ~2 GFLOP each, milliseconds on a 2-core CPU
PEAK_REPEATS = 5  # timed products per dtype (their median counts), after one warm-up
# Where train.py writes without a hydra.run.dir override (conf/train.yaml), spelled for strftime.
DEFAULT_RUN_DIR = "outputs/%Y-%m-%d/%H-%M-%S"


@dataclass(frozen=True)
class MatmulPeaks:
    """What the choice is made from: the device and its measured matrix-product speeds."""

    device: str  # "cpu", or the GPU's name
    on_gpu: bool
    fast_bf16: bool  # native bf16 matrix instructions (CPU flags; on a GPU, non-emulated bf16)
    bf16_tflops: float | None  # None: not measured (no fast bf16, or a GPU)
    fp32_tflops: float | None  # None: not measured (a GPU)


@dataclass(frozen=True)
class RecipeChoice:
    """The experiment to train, why, and the measurements behind it (None where ``--recipe`` forced it)."""

    experiment: str
    reason: str
    peaks: MatmulPeaks | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "experiment": self.experiment,
            "reason": self.reason,
            "forced": self.peaks is None,
            "min_bf16_speedup": MIN_BF16_SPEEDUP,
            "peaks": asdict(self.peaks) if self.peaks is not None else None,
        }


def measure_matmul(size: int = PEAK_SIZE, repeats: int = PEAK_REPEATS) -> MatmulPeaks:
    """This machine's bf16 and fp32 matrix-product TFLOP/s (:func:`app.hardware.matmul_peak_tflops`).

    Nothing is measured on a GPU; on a CPU without native bf16 only fp32 is (one emulated bf16 product
    of this size takes seconds there). Under a second on a 2-core CPU.
    """
    if torch.cuda.is_available():
        return MatmulPeaks(
            device=torch.cuda.get_device_name(),
            on_gpu=True,
            fast_bf16=fast_bf16("cuda"),
            bf16_tflops=None,
            fp32_tflops=None,
        )
    return MatmulPeaks(
        device="cpu",
        on_gpu=False,
        fast_bf16=fast_bf16("cpu"),
        bf16_tflops=matmul_peak_tflops(torch.bfloat16, size=size, repeats=repeats),
        fp32_tflops=matmul_peak_tflops(torch.float32, size=size, repeats=repeats),
    )


def choose_recipe(peaks: MatmulPeaks, min_speedup: float = MIN_BF16_SPEEDUP) -> RecipeChoice:
    """The quickstart recipe for a machine measured as ``peaks``, with a reason that shows the numbers."""
    if peaks.on_gpu:
        native = "native bf16: precision=auto picks bf16" if peaks.fast_bf16 else "bf16 only emulated"
        return _chosen(
            BF16_RECIPE if peaks.fast_bf16 else FP32_RECIPE, f"GPU {peaks.device}, {native}", peaks
        )
    fp32 = _tflops(peaks.fp32_tflops)
    if not peaks.fast_bf16 or peaks.bf16_tflops is None:
        flags = ", ".join(sorted(FAST_BF16_FLAGS))
        why = f"no native bf16 on this CPU (none of {flags} in its flags); fp32 {fp32} TFLOP/s"
        return _chosen(FP32_RECIPE, why, peaks)
    speedup = peaks.bf16_tflops / peaks.fp32_tflops if peaks.fp32_tflops else float("inf")
    experiment, relation = (BF16_RECIPE, ">=") if speedup >= min_speedup else (FP32_RECIPE, "<")
    reason = (
        f"bf16 {_tflops(peaks.bf16_tflops)} TFLOP/s vs fp32 {fp32} "
        f"({speedup:.1f}x {relation} {min_speedup:.1f}x)"
    )
    return _chosen(experiment, reason, peaks)


def forced_recipe(name: str) -> RecipeChoice:
    """The recipe named on the command line (``--recipe``), nothing measured."""
    if name not in RECIPES:
        raise ValueError(f"unknown quickstart recipe {name!r}; valid choices: {', '.join(RECIPES)}")
    return _chosen(name, f"--recipe {name} (forced, nothing measured)", None)


def _chosen(experiment: str, why: str, peaks: MatmulPeaks | None) -> RecipeChoice:
    return RecipeChoice(experiment=experiment, reason=f"{why}: experiment={experiment}", peaks=peaks)


def _tflops(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def split_run_dir(overrides: list[str]) -> tuple[Path, list[str]]:
    """The run directory named by a ``hydra.run.dir=`` override (else train.py's default, made concrete
    now, so that recipe.json and the run share it) and the other overrides, as given.

    Overrides are parsed as Hydra parses them (a syntax error raises ``ValueError`` here, before any
    measuring). An ``experiment`` override is refused: the experiment is what this module chooses.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as err:
        raise ValueError(f"bad train.py override: {err}") from err
    run_dir = None
    rest = []
    for override in parsed:
        if override.key_or_group == "experiment":
            raise ValueError(
                f"{override.input_line!r}: the experiment is chosen here; force one with "
                f"--recipe {' | '.join(RECIPES)}"
            )
        if override.key_or_group == "hydra.run.dir" and not override.is_delete():
            run_dir = str(override.value())
            if "${" in run_dir:
                raise ValueError(f"{override.input_line!r}: give hydra.run.dir as a plain path")
        else:
            rest.append(override.input_line)
    return Path(run_dir or datetime.datetime.now().strftime(DEFAULT_RUN_DIR)), rest


def train_command(choice: RecipeChoice, overrides: list[str], run_dir: Path) -> list[str]:
    """``train.py experiment=<choice> <overrides> hydra.run.dir=<run_dir>`` as a command line."""
    return single_run_command([f"experiment={choice.experiment}", *overrides], run_dir)


def write_choice(choice: RecipeChoice, run_dir: Path) -> Path:
    """``<run dir>/recipe.json``, written atomically (the directory is created)."""
    path = RunDir(run_dir).recipe
    with atomic_write(path, "w", encoding="utf-8") as handle:
        json.dump(choice.to_json(), handle, indent=2)
        handle.write("\n")
    return path


def run_training(command: list[str]) -> int:
    """Run ``command`` and return its exit status as a shell gives it (128 + N when killed by signal N).

    A Ctrl-C reaches the child too (same process group): it is waited for, so that it can stop cleanly.
    """
    return run_train_process(command).shell_status
