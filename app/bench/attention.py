"""Benchmark one attention layer per kernel: forward+backward time and peak memory against sequence length,
and per-step time and cache size of incremental decoding with a KV cache versus recomputation.

    python scripts/bench_attention.py --device cpu --threads 2       # docs/bench/attention_cpu.{csv,png}
    python scripts/bench_attention.py --device cuda                  # docs/bench/attention_cuda.{csv,png}
    python scripts/bench_attention.py --device cpu --lengths 64 128 --repeats 1 --decode-lengths 8 16  # smoke

Layer: :class:`app.attention.MultiHeadAttention` self-attention (batch 1, d_model 512, 8 heads by default)
with the kernels eager, sdpa, flash (backend auto: flash-attn or PyTorch's fused backends on a GPU), flex
(FlexAttention, compiled on CUDA), sparse (sliding window 256, blockwise and as FlexAttention block
sparsity), linear (elu and FAVOR+ feature maps) and GQA (8 query / 2 kv heads, sdpa): the
:class:`~app.bench.attention_cases.KernelCase` list in :mod:`app.bench.attention_cases`.
Times are medians over ``--repeats`` runs after ``--warmup`` runs. Peak memory is what one forward+backward
adds on top of the inputs, weights and weight gradients: ``torch.cuda.max_memory_allocated`` on CUDA, the
running total of the net bytes of ``torch.profiler(profile_memory=True)``'s events on CPU (op granularity;
a peak that cannot be measured is written as ``unmeasured``, with the reason in ``status``).
A (kernel, length) whose estimated memory exceeds ``--max-bytes`` is skipped (and written as skipped), as
are longer lengths of a kernel that ran out of memory. ``--kernel-only`` times the kernel alone on
already projected, head-split q, k, v (mode ``kernel fwd+bwd``): what a kernel choice changes, without the
four d_model x d_model projections every variant shares.

Decoding (MHA vs GQA with sdpa, and linear attention's recurrent state, Katharopoulos et al. 2020 section
3.4): causal self-attention of one layer at target length L, either one query per step against a cache of
the earlier positions (the mean of the last min(8, L / 2) steps) or recomputing all L positions without a
cache; ``cache_bytes`` is the cache after L positions (GQA stores num_kv_heads / num_heads of MHA's keys
and values, linear attention a fixed-size state).
"""

from __future__ import annotations

import argparse
import csv
import platform
from pathlib import Path
from typing import Any

import torch

from app.attention.kernels.flash import flash_attn_module
from app.bench.attention_cases import DECODE_CASES, TRAIN_CASES, Setup, decode_rows, runnable, train_rows
from app.bench.attention_plot import plot, read_rows, title_of
from app.bench.memory import PEAK_UNMEASURED, parse_bytes
from app.bench.timing import REPO_ROOT

DEFAULT_LENGTHS = [128 * 2**i for i in range(8)]  # 128 ... 16384
DEFAULT_DECODE_LENGTHS = [64, 128, 256, 512, 1024]
FIELDS = [
    "bench",
    "variant",
    "kernel",
    "kv_heads",
    "length",
    "mode",
    "time_ms",
    "peak_bytes",
    "cache_bytes",
    "status",
    "device",
    "hardware",
    "dtype",
    "threads",
    "batch",
    "d_model",
    "heads",
    "torch",
]


def hardware_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's as ``platform`` knows it."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="auto: bfloat16 on CUDA (what flash kernels need), float32 on CPU",
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    parser.add_argument(
        "--decode-lengths",
        type=int,
        nargs="*",
        default=DEFAULT_DECODE_LENGTHS,
        help="target lengths of the decoding benchmark (none: skip it)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=[case.name for case in TRAIN_CASES],
        default=None,
        help="forward+backward cases to run, by name (default: all)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument(
        "--causal", action="store_true", help="causal self-attention in the fwd+bwd benchmark"
    )
    parser.add_argument(
        "--kernel-only",
        action="store_true",
        help="time each kernel on projected q, k, v (no projections) in the fwd+bwd benchmark",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--max-bytes",
        type=parse_bytes,
        default=None,
        help="skip runs estimated to need more (e.g. 4GiB); default 4GiB on CPU, 80%% of GPU memory",
    )
    parser.add_argument(
        "--out-csv", type=Path, default=None, help="default docs/bench/attention_<device>.csv"
    )
    parser.add_argument("--out-png", type=Path, default=None, help="default: --out-csv with .png")
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw --out-png from an existing --out-csv"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    args.out_csv = args.out_csv or REPO_ROOT / "docs" / "bench" / f"attention_{args.device}.csv"
    args.out_png = args.out_png or args.out_csv.with_suffix(".png")
    return args


def make_setup(args: argparse.Namespace) -> Setup:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype_name = args.dtype if args.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    max_bytes = args.max_bytes
    if max_bytes is None:
        max_bytes = (
            int(0.8 * torch.cuda.get_device_properties(device).total_memory)
            if device.type == "cuda"
            else 4 * 2**30
        )
    return Setup(
        device=device,
        dtype=getattr(torch, dtype_name),
        batch=args.batch,
        d_model=args.d_model,
        heads=args.heads,
        repeats=args.repeats,
        warmup=args.warmup,
        max_bytes=max_bytes,
        causal=args.causal,
        kernel_only=args.kernel_only,
    )


def main(argv: list[str] | None = None) -> None:
    """Measure every case (or redraw the figure from the CSV), writing the CSV row by row, then the PNG."""
    args = parse_args(argv)
    if args.plot_only:
        rows = read_rows(args.out_csv)
        plot(rows, args.out_png, title=title_of(rows))
        print(f"wrote {args.out_png}")
        return
    setup = make_setup(args)
    common = {
        "device": setup.device.type,
        "hardware": hardware_name(setup.device),
        "dtype": str(setup.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "batch": setup.batch,
        "d_model": setup.d_model,
        "heads": setup.heads,
        "torch": torch.__version__,
    }
    chosen = [case for case in TRAIN_CASES if args.variants is None or case.name in args.variants]
    cases = runnable(chosen, setup.causal)
    flash_path = "flash-attn" if setup.device.type == "cuda" and flash_attn_module() else "torch SDPA"
    print(
        f"{common['hardware']}, {common['dtype']}, {common['threads']} threads; flash kernel via {flash_path}"
    )
    args.out_csv.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with args.out_csv.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        produced = [train_rows(setup, cases, args.lengths)]
        if args.decode_lengths:
            produced.append(decode_rows(setup, DECODE_CASES, args.decode_lengths))
        for source in produced:
            for row in source:
                row = row | common
                writer.writerow(row)
                handle.flush()  # partial results survive an interrupted run
                rows.append(row)
                print(format_row(row), flush=True)
    plot(rows, args.out_png, title=title_of(rows))
    print(f"wrote {args.out_csv} and {args.out_png}")


def format_row(row: dict[str, Any]) -> str:
    """One row as a line for the terminal, printed as it is measured."""
    measured = row.get("peak_bytes") not in ("", None, PEAK_UNMEASURED)
    peak = f"{int(row['peak_bytes']) / 2**20:9.1f} MiB" if measured else ""
    cache = (
        f"cache {int(row['cache_bytes']) / 2**10:.1f} KiB" if row.get("cache_bytes") not in ("", None) else ""
    )
    time_ms = f"{float(row['time_ms']):10.3f} ms" if row.get("time_ms") else ""
    where = f"{row['bench']:6} {row['variant']:16} {row['mode']:9} T={row['length']:<6}"
    return f"{where} {time_ms} {peak} {cache} {row['status']}"
