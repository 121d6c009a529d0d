"""Training throughput and peak memory of a train.py config, measured on real batches.

    python scripts/bench_train.py experiment=quickstart
    python scripts/bench_train.py experiment=quickstart attention=sdpa --windows 5 --window-steps 30
    python scripts/bench_train.py experiment=quickstart trainer.precision=32-true optim.fused=false

Any ``train.py`` override works. The run trains for ``--warmup-steps`` untimed steps (allocator and
oneDNN warm-up, compilation), then ``--windows`` windows of ``--window-steps`` optimizer steps each;
the figure is the median of the windows' rates, so a burst of other work on the machine moves one
window, not the result. Tokens are real source + target tokens (no padding), as in train/tokens_per_s
and the peers' reports. Nothing is validated or checkpointed. Prints one JSON object (``--out`` also
appends it to a JSON-lines file).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from app.data.batch import Batch
from app.distributed import register_resolvers
from app.training import build_run

REPO_ROOT = Path(__file__).resolve().parents[1]


class StepClock(pl.Callback):
    """Time and real / padded token counts of every training step, taken after the optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.tokens: list[int] = []
        self.padded: list[int] = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Batch, batch_idx: int
    ) -> None:
        self.ends.append(time.perf_counter())
        self.tokens.append(batch.num_tokens)
        self.padded.append(batch.src.numel() + batch.tgt_out.numel())


def window_rates(clock: StepClock, warmup: int, windows: int, size: int) -> list[float]:
    """Tokens per second of each window of ``size`` steps after the first ``warmup`` steps."""
    rates = []
    for w in range(windows):
        start = warmup + w * size  # the window's steps are start+1 .. start+size; timed from step start
        tokens = sum(clock.tokens[start + 1 : start + size + 1])
        rates.append(tokens / (clock.ends[start + size] - clock.ends[start]))
    return rates


def bench_config(overrides: list[str], steps: int, out_dir: Path) -> DictConfig:
    """The train config with the overrides, bounded to ``steps`` steps with no validation and no files."""
    register_resolvers()
    fixed = [
        f"trainer.max_steps={steps}",
        "trainer.max_time=null",
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "checkpoint.every_n_steps=null",
        "early_stopping.patience=0",
        "logger.kind=null",
        f"output_dir={out_dir}",
    ]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[*overrides, *fixed])


def measure(overrides: list[str], warmup: int, windows: int, size: int) -> dict[str, Any]:
    """Train the configured model for warmup + windows x size steps; throughput and memory figures."""
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        cfg = bench_config(overrides, warmup + windows * size + 1, Path(tmp))
        run = build_run(cfg)
        clock = StepClock()
        run.trainer.callbacks.append(clock)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        run.trainer.fit(run.module, datamodule=run.datamodule)
    rates = window_rates(clock, warmup, windows, size)
    return {
        "overrides": overrides,
        "precision": str(run.trainer.precision),
        "attention": cfg.attention.kernel,
        "fused_adamw": cfg.optim.fused,
        "compile": cfg.compile,
        "threads": torch.get_num_threads(),
        "parameters": run.module.model.num_parameters(),
        "tokens_per_s_median": round(statistics.median(rates)),
        "tokens_per_s_windows": [round(r) for r in rates],
        "real_token_fraction": round(sum(clock.tokens) / sum(clock.padded), 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak_cuda_mb": round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else 0,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. experiment=quickstart")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first")
    parser.add_argument("--windows", type=int, default=5, help="timed windows (the median is reported)")
    parser.add_argument("--window-steps", type=int, default=30, help="optimizer steps per window")
    parser.add_argument("--out", type=Path, default=None, help="also append the JSON result to this file")
    args = parser.parse_args(argv)
    if min(args.windows, args.window_steps) < 1 or args.warmup_steps < 0:
        parser.error("--windows and --window-steps must be >= 1, --warmup-steps >= 0")
    result = measure(args.overrides, args.warmup_steps, args.windows, args.window_steps)
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as handle:
            handle.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
