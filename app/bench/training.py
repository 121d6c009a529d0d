"""Training throughput, model FLOP utilisation and peak memory of a train.py config, on real batches.

    python scripts/bench_train.py experiment=quickstart --json
    python scripts/bench_train.py experiment=quickstart attention=sdpa --windows 5 --window-steps 30
    python scripts/bench_train.py experiment=quickstart trainer.precision=32-true optim.fused=false
    python scripts/bench_train.py experiment=ablation_length attention=eager,linformer data.concat=16,64

Any ``train.py`` override works, and comma-separated values sweep as under ``train.py -m``: each
configuration is measured in turn (the last override varying fastest) and appended to ``--out`` as it
ends. The run trains for ``--warmup-steps`` untimed steps (allocator and
oneDNN warm-up, compilation), then ``--windows`` windows of ``--window-steps`` optimizer steps each;
the figure is the median of the windows' rates, so a burst of other work on the machine moves one
window, not the result. Tokens are real source + target tokens (no padding), as in train/tokens_per_s
and the peers' reports; ``target_tokens_per_s`` counts the target side alone, the unit fairseq and
NVIDIA's Transformer anchors report. ``warmup_s`` is the time from the first batch to the end of the
untimed steps (where ``compile_model=true`` compiles). Nothing is validated or checkpointed.

MFU (model FLOP utilisation) = model FLOPs per second (``model_tflops``, the achieved TFLOP/s) / measured
matrix-product peak. Model FLOPs are
counted from the model's shapes on the real lengths of every batch (``app/models/flops.py``: 3 x the
forward pass, dense attention, padding excluded; doubled under R-Drop, which runs the model twice over
each batch while its tokens count once). The peak is the best of a bf16 and an fp32 matrix product
timed on the training device right before and after training (on a CPU 2048 x 2048 on the same
threads, on a GPU 8192 x 8192, ``--peak-size`` to change it; ``app.hardware.matmul_peak_tflops``).
``mfu`` divides by the peak of the precision trained in (bf16 for bf16-mixed, else fp32); ``mfu_bf16``
always by the bf16 peak. Where the device has no fast bf16 path (a CPU without AVX512-BF16, AMX or Arm
BF16, where one emulated 2048 product takes seconds) the bf16 peak is not measured: ``peak_bf16_tflops``
and ``mfu_bf16`` are null and the summary says ``n/a: no fast bf16 on this CPU``. Prints a
summary, or with ``--json`` one JSON object (``--out`` also appends it to a JSON-lines file).
``--table FILE...`` prints earlier ``--out`` files as one Markdown table instead of measuring. A
configuration that runs out of GPU memory is a result too (the longest input a kernel fits): it is
printed and written with an ``error`` instead of figures, and the command still succeeds. With
``--keep-going`` any other failure of a configuration is written the same way and the sweep goes on to
the next one; the command then exits with status 1.
``--profile N`` records N more steps with ``torch.profiler`` and prints its operator table (stderr).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from app.bench.memory import is_out_of_memory, peak_rss_mb
from app.bench.runs import StepClock, bench_config
from app.bench.timing import window_rates
from app.hardware import cpu_description, matmul_peak_tflops
from app.training.task import build_fit

PROFILE_ROWS = 25  # operators listed by --profile, by their own (self) CPU time
NO_PEAK = "n/a: no fast bf16 on this CPU"  # what the summary says for a bf16 peak that was not measured


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


def peak_tflops(device: torch.device, size: int | None = None) -> dict[str, float | None]:
    """bf16 and fp32 matrix-product TFLOP/s on the training device (a CPU: its current threads); None
    for bf16 where the device has no fast bf16 path (``matmul_peak_tflops`` then runs no product)."""
    return {
        "bf16": matmul_peak_tflops(torch.bfloat16, size=size, device=device),
        "fp32": matmul_peak_tflops(torch.float32, size=size, device=device),
    }


def best_peaks(*measured: dict[str, float | None]) -> dict[str, float | None]:
    """The best of several measurements of each dtype's peak (None where it was never measured)."""
    best: dict[str, float | None] = {}
    for dtype in measured[0]:
        values = [peaks[dtype] for peaks in measured if peaks[dtype] is not None]
        best[dtype] = max(values) if values else None
    return best


def ratio(value: float, peak: float | None) -> float | None:
    """``value / peak`` unrounded (a tiny model on a large GPU uses well under 0.01%: rounded, its
    utilisation read as zero), or None without a peak."""
    return None if peak is None else value / peak


def utilisation(
    clock: StepClock, precision: str, peaks: dict[str, float | None], *window: int
) -> dict[str, Any]:
    """Model TFLOP/s (median window) and MFU against the peak of the training precision and bf16's
    (None where the model's FLOPs cannot be counted, e.g. an RNN, or the peak was not measured)."""
    if not clock.flops or len(clock.flops) != len(clock.ends):
        return {"model_tflops": None, "mfu": None, "mfu_bf16": None}
    model_tflops = statistics.median(window_rates(clock.flops, clock.ends, *window)) / 1e12
    peak = peaks["bf16"] if "bf16" in precision else peaks["fp32"]
    return {
        "model_tflops": model_tflops,
        "mfu": ratio(model_tflops, peak),
        "mfu_bf16": ratio(model_tflops, peaks["bf16"]),
    }


def measure(
    overrides: list[str],
    warmup: int,
    windows: int,
    size: int,
    profile: int = 0,
    *,
    peak_size: int | None = None,
) -> dict[str, Any]:
    """Train the configured model for warmup + windows x size steps; throughput and memory figures.

    With ``profile`` > 0, ``torch.profiler`` also records that many steps after the timed windows
    (so it slows none of them); its operator table is returned under ``profile``. ``peak_size`` is the
    side of the peak's matrix product (default: ``matmul_peak_tflops``'s, 2048 on a CPU).
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
        device = run.trainer.strategy.root_device  # the peak is measured where the model trains
        before = peak_tflops(device, peak_size)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # after the peak's products: training's memory alone
        try:
            run.trainer.fit(run.module, datamodule=run.datamodule)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            return out_of_memory(overrides, err)
        peak_cuda_mb = round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else 0
        after = peak_tflops(device, peak_size)
    peaks = best_peaks(before, after)
    rates = window_rates(clock.tokens, clock.ends, warmup, windows, size)
    target_rates = window_rates(clock.target_tokens, clock.ends, warmup, windows, size)
    precision = str(run.trainer.precision)
    return {
        "overrides": overrides,
        "precision": precision,
        "attention": OmegaConf.to_container(cfg.attention, resolve=True),
        "fused_adamw": cfg.optim.fused,
        "compile_model": cfg.compile_model,
        "passes_per_batch": run.module.passes_per_batch,
        "threads": torch.get_num_threads(),
        "parameters": run.module.model.num_parameters(),
        "tokens_per_s": round(statistics.median(rates)),
        "tokens_per_s_windows": [round(r) for r in rates],
        "target_tokens_per_s": round(statistics.median(target_rates)),
        "warmup_s": None if clock.first_batch is None else round(clock.ends[warmup] - clock.first_batch, 2),
        **utilisation(clock, precision, peaks, warmup, windows, size),
        **{f"peak_{dtype}_tflops": None if peak is None else round(peak, 4) for dtype, peak in peaks.items()},
        "real_token_fraction": round(sum(clock.tokens) / sum(clock.padded), 3),
        "peak_rss_mb": peak_rss_mb(),
        "peak_cuda_mb": peak_cuda_mb,
        **machine(),
        **({"profile": profiler.table} if profile else {}),
    }


def machine() -> dict[str, Any]:
    """Where a result was measured: the GPU's name (or "cpu") and the CPU's model, flags and threads."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"device": device, **cpu_description()}


def out_of_memory(overrides: list[str], err: BaseException) -> dict[str, Any]:
    """The result of a configuration that ran out of memory while training: a finding of the benchmark
    (the longest input a kernel fits), recorded with the error's first line instead of figures."""
    return failed(overrides, err, "out of memory")


def failed(overrides: list[str], err: BaseException, what: str | None = None) -> dict[str, Any]:
    """A configuration's result recorded as an error instead of figures: ``what`` (default: the error's
    type) and the error's first line."""
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return {"overrides": overrides, "error": f"{what or type(err).__name__}: {first_line[:200]}", **machine()}


def summary(result: dict[str, Any]) -> str:
    """The headline figures in one line for a person."""
    if "error" in result:
        where = f"{result['device']}, {result['cpu_model']}"
        return f"{' '.join(result['overrides'])}: {result['error']} ({where})"
    mfu = "n/a" if result["mfu"] is None else f"{100 * result['mfu']:.1f}%"
    tflops = "n/a" if result["model_tflops"] is None else f"{result['model_tflops']:.4g}"
    target = result.get("target_tokens_per_s")
    target = "" if target is None else f" ({target:,} target)"
    bf16 = result["peak_bf16_tflops"]
    if bf16 is None:
        bf16 = NO_PEAK if result.get("device", "cpu") == "cpu" else "n/a: no fast bf16 on this GPU"
    return (
        f"{result['tokens_per_s']:,} tokens/s{target}, achieved {tflops} TFLOP/s, MFU {mfu} "
        f"(peaks bf16 {bf16} / fp32 {result['peak_fp32_tflops']} TFLOP/s, "
        f"{result['threads']} threads, {result['cpu_model']}), peak RSS {result['peak_rss_mb']} MB"
    )


def error_label(error: str) -> str:
    """What a table says in place of a failed configuration's figures."""
    return "OOM" if error.startswith("out of memory") else "failed"


def results_table(paths: list[Path]) -> str:
    """A Markdown table of benchmark JSON lines: one row per configuration and file, the runs in order.

    Rows keep the first-seen order of (file, overrides); each cell lists that configuration's runs, so
    alternating rounds written to the same files read side by side. A run that ran out of memory reads
    "OOM" in the tokens/s column, one that failed otherwise (``--keep-going``) "failed".
    """
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                result = json.loads(line)
                rows.setdefault((path.name, " ".join(result["overrides"])), []).append(result)

    def cells(runs: list[dict[str, Any]], key: str, scale: float, digits: int) -> str:
        return ", ".join(
            error_label(run["error"]) if "error" in run else f"{run[key] * scale:,.{digits}f}"
            for run in runs
            if ("error" in run and key == "tokens_per_s") or run.get(key)  # null or 0 (no GPU): left out
        )

    lines = [
        "| file | overrides | tokens/s | target tokens/s | achieved TFLOP/s | MFU vs bf16 peak (%) "
        "| peak bf16 TFLOP/s | peak RSS MB | peak GPU MB | device | CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, overrides), runs in rows.items():
        figures = [
            cells(runs, key, scale, digits)
            for key, scale, digits in [
                ("tokens_per_s", 1, 0),
                ("target_tokens_per_s", 1, 0),
                ("model_tflops", 1, 3),
                ("mfu_bf16", 100, 1),
                ("peak_bf16_tflops", 1, 3),
                ("peak_rss_mb", 1, 0),
                ("peak_cuda_mb", 1, 0),
            ]
        ]
        where = [runs[0].get("device", "cpu"), runs[0].get("cpu_model", "")]
        lines.append(f"| {name} | `{overrides}` | {' | '.join(figures + where)} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: train.py overrides anywhere among the options."""
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
        "--keep-going",
        action="store_true",
        help="record a configuration that fails as an error and go on to the next (exit status 1 at the end)",
    )
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
    parser.add_argument(
        "--peak-size",
        type=int,
        default=None,
        metavar="N",
        help="side of the matrix product timed for the peak (default: 2048 on a CPU, 8192 on a GPU)",
    )
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after the options
    if min(args.windows, args.window_steps) < 1 or args.warmup_steps < 0:
        parser.error("--windows and --window-steps must be >= 1, --warmup-steps >= 0")
    if args.peak_size is not None and args.peak_size < 1:
        parser.error(f"--peak-size must be >= 1, got {args.peak_size}")
    return args


def sweep(overrides: list[str]) -> list[list[str]]:
    """Every configuration that the overrides ask for, in Hydra's sweep syntax (as ``train.py -m``):
    ``attention=eager,sdpa data.concat=64,256`` gives four override lists, the last override varying
    fastest. Hydra's own parser reads them, so a list value (``key=[a,b]``) stays one value."""
    choices = [
        [f"{o.get_key_element()}={value}" for value in o.sweep_string_iterator()]
        if o.is_sweep_override()
        else [o.input_line]
        for o in OverridesParser.create().parse_overrides(overrides)
    ]
    return [list(combination) for combination in itertools.product(*choices)]


def main(argv: list[str] | None = None) -> int:
    """Measure each configuration the overrides sweep over, one after another in this process, and
    print each result as it comes (or print earlier results as a table with ``--table``)."""
    args = parse_args(argv)
    if args.table:
        print(results_table(args.table))
        return 0
    failures = 0
    for overrides in sweep(args.overrides):
        try:
            result = measure(
                overrides,
                args.warmup_steps,
                args.windows,
                args.window_steps,
                args.profile,
                peak_size=args.peak_size,
            )
        except Exception as err:
            if not args.keep_going:
                raise
            traceback.print_exc()  # the whole story on stderr; the result keeps its first line
            result, failures = failed(overrides, err), failures + 1
        table = result.pop("profile", "")
        line = json.dumps(result)
        print(line if args.json else summary(result), flush=True)
        if table:
            print(f"torch.profiler, {args.profile} steps after the timed windows:\n{table}", file=sys.stderr)
        if args.out:  # appended as each ends: a sweep cut short keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as handle:
                handle.write(line + "\n")
        gc.collect()  # the next configuration starts from an empty device
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 1 if failures else 0
