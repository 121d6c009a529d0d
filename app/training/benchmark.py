"""Training throughput, model FLOP utilisation and peak memory of a train.py config, on real batches.

    python scripts/bench_train.py experiment=quickstart --json
    python scripts/bench_train.py experiment=quickstart attention=sdpa --windows 5 --window-steps 30
    python scripts/bench_train.py experiment=quickstart trainer.precision=32-true optim.fused=false

Any ``train.py`` override works. The run trains for ``--warmup-steps`` untimed steps (allocator and
oneDNN warm-up, compilation), then ``--windows`` windows of ``--window-steps`` optimizer steps each;
the figure is the median of the windows' rates, so a burst of other work on the machine moves one
window, not the result. Tokens are real source + target tokens (no padding), as in train/tokens_per_s
and the peers' reports. Nothing is validated or checkpointed.

MFU (model FLOP utilisation) = model FLOPs per second / measured matrix-product peak. Model FLOPs are
counted from the model's shapes on the real lengths of every batch (``app/models/flops.py``: 3 x the
forward pass, dense attention, padding excluded; doubled under R-Drop, which runs the model twice over
each batch while its tokens count once). The peak is the best of a bf16 and an fp32 matrix product
timed on the training device right before and after training (on a CPU 2048 x 2048 on the same
threads, on a GPU 8192 x 8192; ``app.hardware.matmul_peak_tflops``). ``mfu`` divides by the peak of
the precision trained in (bf16 for bf16-mixed, else fp32); ``mfu_bf16`` always by the bf16 peak. Prints a
summary, or with ``--json`` one JSON object (``--out`` also appends it to a JSON-lines file).
``--table FILE...`` prints earlier ``--out`` files as one Markdown table instead of measuring.
``--profile N`` records N more steps with ``torch.profiler`` and prints its operator table (stderr).
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
from omegaconf import DictConfig, OmegaConf

from app.data.batch import Batch
from app.hardware import cpu_description, matmul_peak_tflops
from app.models.flops import batch_lengths, supports_flop_count, transformer_training_flops
from app.training.distributed import register_resolvers
from app.training.task import build_fit

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILE_ROWS = 25  # operators listed by --profile, by their own (self) CPU time


class StepClock(pl.Callback):
    """Time, real / padded token counts and model FLOPs of every training step, after the optimizer step."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.tokens: list[int] = []
        self.padded: list[int] = []
        self.flops: list[int] = []

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Batch, batch_idx: int
    ) -> None:
        self.ends.append(time.perf_counter())
        self.tokens.append(batch.num_tokens)
        self.padded.append(batch.src.numel() + batch.tgt_out.numel())
        model = pl_module.model
        if supports_flop_count(model):
            lengths = batch_lengths(batch.src, batch.tgt_out, batch.pad_id)
            passes = pl_module.passes_per_batch  # R-Drop runs the model twice over each batch
            self.flops.append(passes * transformer_training_flops(model, *lengths))


class StepProfile(pl.Callback):
    """``torch.profiler`` over ``steps`` training steps from step ``start``: where a step's time goes."""

    def __init__(self, start: int, steps: int) -> None:
        self.start, self.steps = start, steps
        self.profiler: torch.profiler.profile | None = None
        self.table = ""

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == self.start:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.__enter__()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.profiler is not None and batch_idx == self.start + self.steps - 1:
            self.profiler.__exit__(None, None, None)
            averages = self.profiler.key_averages()
            self.table = averages.table(sort_by="self_cpu_time_total", row_limit=PROFILE_ROWS)
            self.profiler = None


def window_rates(counts: list[int], ends: list[float], warmup: int, windows: int, size: int) -> list[float]:
    """``counts`` (tokens, FLOPs) per second of each window of ``size`` steps after ``warmup`` steps."""
    rates = []
    for w in range(windows):
        start = warmup + w * size  # the window's steps are start+1 .. start+size; timed from step start
        total = sum(counts[start + 1 : start + size + 1])
        rates.append(total / (ends[start + size] - ends[start]))
    return rates


def peak_tflops(device: torch.device) -> dict[str, float]:
    """bf16 and fp32 matrix-product TFLOP/s on the training device (a CPU: its current threads)."""
    return {
        "bf16": matmul_peak_tflops(torch.bfloat16, device=device),
        "fp32": matmul_peak_tflops(torch.float32, device=device),
    }


def utilisation(clock: StepClock, precision: str, peaks: dict[str, float], *window: int) -> dict[str, Any]:
    """Model TFLOP/s (median window) and MFU against the peak of the training precision and bf16's."""
    if len(clock.flops) != len(clock.ends):  # e.g. an RNN: no FLOP count, no MFU
        return {"model_tflops": None, "mfu": None, "mfu_bf16": None}
    model_tflops = statistics.median(window_rates(clock.flops, clock.ends, *window)) / 1e12
    peak = peaks["bf16"] if "bf16" in precision else peaks["fp32"]
    return {
        "model_tflops": round(model_tflops, 4),
        "mfu": round(model_tflops / peak, 4),
        "mfu_bf16": round(model_tflops / peaks["bf16"], 4),
    }


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


def measure(overrides: list[str], warmup: int, windows: int, size: int, profile: int = 0) -> dict[str, Any]:
    """Train the configured model for warmup + windows x size steps; throughput and memory figures.

    With ``profile`` > 0, ``torch.profiler`` also records that many steps after the timed windows
    (so it slows none of them); its operator table is returned under ``profile``.
    """
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        timed = warmup + windows * size + 1
        cfg = bench_config(overrides, timed + profile, Path(tmp))
        run = build_fit(cfg)
        clock = StepClock()
        run.trainer.callbacks.append(clock)
        profiler = StepProfile(start=timed, steps=profile)
        if profile:
            run.trainer.callbacks.append(profiler)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        device = run.trainer.strategy.root_device  # the peak is measured where the model trains
        before = peak_tflops(device)
        run.trainer.fit(run.module, datamodule=run.datamodule)
        after = peak_tflops(device)
    peaks = {dtype: max(before[dtype], after[dtype]) for dtype in before}
    rates = window_rates(clock.tokens, clock.ends, warmup, windows, size)
    precision = str(run.trainer.precision)
    return {
        "overrides": overrides,
        "precision": precision,
        "attention": OmegaConf.to_container(cfg.attention, resolve=True),
        "fused_adamw": cfg.optim.fused,
        "compile": cfg.compile,
        "passes_per_batch": run.module.passes_per_batch,
        "threads": torch.get_num_threads(),
        "parameters": run.module.model.num_parameters(),
        "tokens_per_s": round(statistics.median(rates)),
        "tokens_per_s_windows": [round(r) for r in rates],
        **utilisation(clock, precision, peaks, warmup, windows, size),
        "peak_bf16_tflops": round(peaks["bf16"], 4),
        "peak_fp32_tflops": round(peaks["fp32"], 4),
        "real_token_fraction": round(sum(clock.tokens) / sum(clock.padded), 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "peak_cuda_mb": round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else 0,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        **cpu_description(),
        **({"profile": profiler.table} if profile else {}),
    }


def summary(result: dict[str, Any]) -> str:
    """The headline figures in one line for a person."""
    mfu = "n/a" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
    return (
        f"{result['tokens_per_s']:,} tokens/s, {result['model_tflops']} model TFLOP/s, MFU {mfu} "
        f"(peaks bf16 {result['peak_bf16_tflops']} / fp32 {result['peak_fp32_tflops']} TFLOP/s, "
        f"{result['threads']} threads, {result['cpu_model']}), peak RSS {result['peak_rss_mb']} MB"
    )


def results_table(paths: list[Path]) -> str:
    """A Markdown table of benchmark JSON lines: one row per configuration and file, the runs in order.

    Rows keep the first-seen order of (file, overrides); each cell lists that configuration's runs, so
    alternating rounds written to the same files read side by side.
    """
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                result = json.loads(line)
                rows.setdefault((path.name, " ".join(result["overrides"])), []).append(result)

    def cells(runs: list[dict[str, Any]], key: str, scale: float = 1.0, digits: int = 0) -> str:
        return ", ".join(f"{run[key] * scale:,.{digits}f}" for run in runs if run.get(key) is not None)

    lines = [
        "| file | overrides | tokens/s | MFU vs bf16 peak (%) | peak bf16 TFLOP/s | peak RSS MB | CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, overrides), runs in rows.items():
        figures = [
            cells(runs, "tokens_per_s"),
            cells(runs, "mfu_bf16", 100, 1),
            cells(runs, "peak_bf16_tflops", 1, 3),
            cells(runs, "peak_rss_mb"),
        ]
        lines.append(f"| {name} | `{overrides}` | {' | '.join(figures)} | {runs[0].get('cpu_model', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. experiment=quickstart")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first")
    parser.add_argument("--windows", type=int, default=5, help="timed windows (the median is reported)")
    parser.add_argument("--window-steps", type=int, default=30, help="optimizer steps per window")
    parser.add_argument("--out", type=Path, default=None, help="also append the JSON result to this file")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="also print torch.profiler's top operators over STEPS more steps",
    )
    parser.add_argument(
        "--table",
        type=Path,
        nargs="+",
        metavar="JSONL",
        help="print earlier results (--out files) as a Markdown table instead of measuring",
    )
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after the options
    if args.table:
        print(results_table(args.table))
        return 0
    if min(args.windows, args.window_steps) < 1 or args.warmup_steps < 0:
        parser.error("--windows and --window-steps must be >= 1, --warmup-steps >= 0")
    result = measure(args.overrides, args.warmup_steps, args.windows, args.window_steps, args.profile)
    table = result.pop("profile", "")
    line = json.dumps(result)
    print(line if args.json else summary(result))
    if table:
        print(f"torch.profiler, {args.profile} steps after the timed windows:\n{table}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as handle:
            handle.write(line + "\n")
    return 0
