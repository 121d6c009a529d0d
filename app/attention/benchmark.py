"""Benchmark one attention layer per kernel: forward+backward time and peak memory against sequence length,
and per-step time and cache size of incremental decoding with a KV cache versus recomputation.

    python scripts/bench_attention.py --device cpu --threads 2       # docs/bench/attention_cpu.{csv,png}
    python scripts/bench_attention.py --device cuda                  # docs/bench/attention_cuda.{csv,png}
    python scripts/bench_attention.py --device cpu --lengths 64 128 --repeats 1 --decode-lengths 8 16  # smoke

Layer: :class:`app.attention.MultiHeadAttention` self-attention (batch 1, d_model 512, 8 heads by default)
with the kernels eager, sdpa, flash (backend auto: flash-attn or PyTorch's fused backends on a GPU), sparse
(sliding window 256), linear (elu and FAVOR+ feature maps) and GQA (8 query / 2 kv heads, sdpa).
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
import contextlib
import csv
import functools
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch import Tensor

from app.attention import KVCache, MultiHeadAttention, build_kernel
from app.attention.kernels.flash import flash_attn_module

REPO_ROOT = Path(__file__).resolve().parents[2]

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


@dataclass(frozen=True)
class Variant:
    """One attention layer configuration: a registered kernel, its options and the kv head count."""

    name: str
    kernel: str
    options: dict[str, Any] = field(default_factory=dict)
    kv_heads: int | None = None  # None = MHA


VARIANTS = [
    Variant("eager", "eager"),
    Variant("sdpa", "sdpa"),
    Variant("flash", "flash", {"backend": "auto"}),
    Variant("sparse_window256", "sparse", {"pattern": "sliding_window", "window": 256}),
    Variant(
        "sparse_window256_recompute",
        "sparse",
        {"pattern": "sliding_window", "window": 256, "recompute": True},
    ),
    Variant("linear_elu", "linear", {"feature_map": "elu"}),
    Variant("linear_favor", "linear", {"feature_map": "favor", "num_features": 64}),
    Variant("gqa_sdpa_kv2", "sdpa", kv_heads=2),
]
DECODE_VARIANTS = [
    Variant("mha_sdpa", "sdpa"),
    Variant("gqa_sdpa_kv2", "sdpa", kv_heads=2),
    Variant("linear_elu", "linear", {"feature_map": "elu"}),
]


@dataclass(frozen=True)
class Setup:
    """What every measurement shares."""

    device: torch.device
    dtype: torch.dtype
    batch: int
    d_model: int
    heads: int
    repeats: int
    warmup: int
    max_bytes: int
    causal: bool
    kernel_only: bool = False  # time the kernel on projected q, k, v instead of the whole layer


# --- helpers ---------------------------------------------------------------------------------------------


def parse_bytes(text: str) -> int:
    """'4GiB', '512M', '1e9' -> bytes (K/M/G/T are binary multiples)."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)(i?B)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512M, 1e9)")
    scale = 1024 ** " KMGT".index(match.group(2) or " ")
    return int(float(match.group(1)) * scale)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(run: Callable[[], Any], setup: Setup) -> float:
    """Median wall-clock milliseconds of ``run`` over ``setup.repeats`` calls, after ``setup.warmup``."""
    for _ in range(setup.warmup):
        run()
    times = []
    for _ in range(setup.repeats):
        synchronize(setup.device)
        start = time.perf_counter()
        run()
        synchronize(setup.device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


PEAK_UNMEASURED = "unmeasured"  # the peak_bytes cell when no allocation could be observed


def peak_bytes(run: Callable[[], Any], device: torch.device) -> int | None:
    """Bytes that one call of ``run`` allocates at its peak, beyond what was allocated before it.

    ``None`` when the peak cannot be measured: the CPU profiler recorded no allocation at all.
    """
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    activities = [torch.profiler.ProfilerActivity.CPU]
    with quiet_stderr(), torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        run()
    return cpu_peak_from_events(prof.events())


def cpu_peak_from_events(events: Iterable[Any]) -> int | None:
    """The running total's maximum over the net CPU bytes of the profiler's events, in time order.

    Public ``FunctionEvent`` fields only: an op's ``cpu_memory_usage`` includes its children's, so each
    op without children counts its own (at its start) and each parent only its ``self_cpu_memory_usage``
    (allocations at its start, frees at its end); frees outside any op are top-level ``[memory]`` events.
    Allocations a parent makes and frees between two of its children are not seen (ops' granularity).
    """
    changes: list[tuple[float, int]] = []  # (time in us, net bytes)

    def visit(event: Any) -> None:
        if not event.cpu_children:
            changes.append((event.time_range.start, event.cpu_memory_usage))
            return
        for child in event.cpu_children:
            visit(child)
        own = event.self_cpu_memory_usage
        changes.append((event.time_range.start if own > 0 else event.time_range.end, own))

    for event in events:
        if event.cpu_parent is None:
            visit(event)
    if not any(nbytes for _, nbytes in changes):
        return None
    total = peak = 0
    for _, nbytes in sorted(changes, key=lambda change: change[0]):
        total += nbytes
        peak = max(peak, total)
    return peak


def timed_row(time_ms: float, peak: int | None) -> dict[str, Any]:
    """The measured cells of a row; a peak that could not be measured says so in the cell and the status."""
    if peak is None:
        status = "ok; peak memory not measured (the profiler recorded no allocation)"
        return {"time_ms": f"{time_ms:.3f}", "peak_bytes": PEAK_UNMEASURED, "status": status}
    return {"time_ms": f"{time_ms:.3f}", "peak_bytes": peak, "status": "ok"}


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ start/stop lines) for the duration of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError | MemoryError) or "out of memory" in str(err).lower()


def make_layer(variant: Variant, setup: Setup) -> MultiHeadAttention:
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        d_model=setup.d_model,
        num_heads=setup.heads,
        num_kv_heads=variant.kv_heads,
        kernel=build_kernel(variant.kernel, **variant.options),
    )
    return layer.to(device=setup.device, dtype=setup.dtype)


def estimated_bytes(layer: MultiHeadAttention, length: int, setup: Setup) -> int:
    """A rough upper bound of what one forward+backward allocates; only used to skip runs.

    Projections, context and their gradients are O(T D); on top of them each query row keeps what its
    kernel says it materialises (``scores_per_query``: eager's T x T scores and weights, a sparse band,
    linear attention's chunk and features, nothing for fused kernels).
    """
    elem = setup.dtype.itemsize
    linear_terms = 16 * setup.batch * length * setup.d_model * elem
    per_query = layer.kernel.scores_per_query(length, head_dim=layer.head_dim)
    return linear_terms + setup.batch * setup.heads * length * per_query * max(elem, 4)


def hardware_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


# --- forward + backward ----------------------------------------------------------------------------------


def train_rows(setup: Setup, variants: list[Variant], lengths: list[int]) -> Iterator[dict[str, Any]]:
    """One row per (variant, length): forward+backward time and peak memory, or why it was skipped."""
    for variant in variants:
        layer = make_layer(variant, setup)
        failed_at: int | None = None
        for length in lengths:
            row = {"bench": "train", "variant": variant.name, "kernel": variant.kernel, "length": length}
            mode = "kernel fwd+bwd" if setup.kernel_only else "fwd+bwd"
            row |= {"kv_heads": variant.kv_heads or setup.heads, "mode": mode, "cache_bytes": ""}
            estimate = estimated_bytes(layer, length, setup)
            if failed_at is not None:
                yield row | {"status": f"skipped: out of memory at length {failed_at}"}
                continue
            if estimate > setup.max_bytes:
                yield row | {"status": f"skipped: estimated {estimate / 2**30:.1f} GiB > --max-bytes"}
                continue
            try:
                measure = measure_kernel if setup.kernel_only else measure_train
                yield row | measure(layer, length, setup)
            except (RuntimeError, MemoryError) as err:
                if not is_out_of_memory(err):
                    raise
                failed_at = length
                yield row | {"status": "failed: out of memory"}
            finally:
                if setup.device.type == "cuda":
                    torch.cuda.empty_cache()


def measure_train(layer: MultiHeadAttention, length: int, setup: Setup) -> dict[str, Any]:
    gen = torch.Generator(device=setup.device).manual_seed(0)
    shape = (setup.batch, length, setup.d_model)
    x = torch.randn(shape, generator=gen, device=setup.device, dtype=setup.dtype).requires_grad_()
    grad = torch.randn(shape, generator=gen, device=setup.device, dtype=setup.dtype)

    def step() -> None:
        # Weight gradients stay allocated between calls (a constant 4 D^2 numbers, not the kernel's doing),
        # so the peak measures activations, attention intermediates and the input gradient.
        layer.zero_grad(set_to_none=False)
        x.grad = None
        out, _ = layer(x, causal=setup.causal)  # (B, T, D)
        out.backward(grad)

    time_ms = median_ms(step, setup)
    x.grad = None
    return timed_row(time_ms, peak_bytes(step, setup.device))


def measure_kernel(layer: MultiHeadAttention, length: int, setup: Setup) -> dict[str, Any]:
    """Forward+backward of the layer's kernel alone on random q (B, H, T, Dh) and k, v (B, Hkv, T, Dh)."""
    gen = torch.Generator(device=setup.device).manual_seed(0)
    b, dh = setup.batch, layer.head_dim

    def leaf(heads: int) -> Tensor:
        shape = (b, heads, length, dh)
        return torch.randn(shape, generator=gen, device=setup.device, dtype=setup.dtype).requires_grad_()

    q, k, v = leaf(layer.num_heads), leaf(layer.num_kv_heads), leaf(layer.num_kv_heads)
    grad = torch.randn(b, layer.num_heads, length, dh, generator=gen, device=setup.device, dtype=setup.dtype)

    def step() -> None:
        for tensor in (q, k, v):
            tensor.grad = None
        layer.kernel(q, k, v, causal=setup.causal).context.backward(grad)

    time_ms = median_ms(step, setup)
    return timed_row(time_ms, peak_bytes(step, setup.device))


# --- incremental decoding --------------------------------------------------------------------------------


def decode_rows(setup: Setup, variants: list[Variant], lengths: list[int]) -> Iterator[dict[str, Any]]:
    """Per-step time at each target length, with a cache and by recomputation, and the cache size."""
    for variant in variants:
        layer = make_layer(variant, setup).eval()
        for length in lengths:
            row = {"bench": "decode", "variant": variant.name, "kernel": variant.kernel, "length": length}
            row |= {"kv_heads": variant.kv_heads or setup.heads, "peak_bytes": "", "status": "ok"}
            gen = torch.Generator(device=setup.device).manual_seed(0)
            x = torch.randn(
                setup.batch, length, setup.d_model, generator=gen, device=setup.device, dtype=setup.dtype
            )
            with torch.no_grad():
                cached_ms, cache_bytes = time_cached_steps(layer, x, setup)
                recompute_ms = median_ms(functools.partial(layer, x, causal=True), setup)
            yield row | {"mode": "cached", "time_ms": f"{cached_ms:.4f}", "cache_bytes": cache_bytes}
            yield row | {"mode": "recompute", "time_ms": f"{recompute_ms:.4f}", "cache_bytes": 0}


def time_cached_steps(layer: MultiHeadAttention, x: Tensor, setup: Setup) -> tuple[float, int]:
    """Median per-step time of cached decoding at the end of ``x`` (B, L, D), and the final cache size.

    Each repeat fills a fresh cache with the first L - n positions (not timed), then decodes the last
    n = min(8, L / 2) positions one query at a time; the cache holds all L positions afterwards.
    """
    length = x.size(1)
    steps = min(8, max(1, length // 2))
    start = length - steps

    def run() -> tuple[float, KVCache]:
        cache = KVCache(max_len=layer.kernel.cache_window())
        if start:
            layer(x[:, :start], causal=True, cache=cache)
        synchronize(setup.device)
        begin = time.perf_counter()
        for t in range(start, length):
            layer(x[:, t : t + 1], causal=True, cache=cache)
        synchronize(setup.device)
        return (time.perf_counter() - begin) * 1e3 / steps, cache

    for _ in range(setup.warmup):
        run()
    times, caches = zip(*(run() for _ in range(setup.repeats)), strict=True)
    return statistics.median(times), caches[-1].nbytes()


# --- output ----------------------------------------------------------------------------------------------


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Four log-log panels against length: fwd+bwd time, peak memory, decoding step time, cache size.

    A variant keeps its colour in every panel; in the decoding panel solid lines are cached decoding
    and dashed lines recomputation.
    """
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    train = [r for r in rows if r["bench"] == "train" and r["status"].startswith("ok")]
    decode = [r for r in rows if r["bench"] == "decode"]
    cached = [r for r in decode if r["mode"] == "cached"]
    names = list(dict.fromkeys(r["variant"] for r in rows))
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    panels = [
        (axes[0, 0], train, "time_ms", 1.0, "forward + backward time (ms)", "sequence length"),
        (axes[0, 1], train, "peak_bytes", 2**-20, "peak memory (MiB)", "sequence length"),
        (axes[1, 0], decode, "time_ms", 1.0, "decoding time per step (ms)", "target length"),
        (axes[1, 1], cached, "cache_bytes", 2**-10, "cache after L positions (KiB)", "target length L"),
    ]
    for ax, subset, key, scale, ylabel, xlabel in panels:
        for (variant, mode), points in series(subset, key).items():
            xs, ys = zip(*points, strict=True)
            label = f"{variant} ({mode})" if subset is decode else variant
            style = "--" if mode == "recompute" else "-"
            ys = [y * scale for y in ys]
            ax.plot(xs, ys, style, color=colours[variant], marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def series(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """{(variant, mode): [(length, value)]} over the rows with a positive value of ``key``."""
    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in rows:
        value = row.get(key)
        if value in ("", None, PEAK_UNMEASURED) or float(value) <= 0:
            continue
        lines.setdefault((row["variant"], row["mode"]), []).append((float(row["length"]), float(value)))
    return lines


def title_of(rows: list[dict[str, Any]]) -> str:
    """The plot title: where and with what settings the rows were measured."""
    if not rows:
        return "no measurements"
    r = rows[0]
    return (
        f"{r['hardware']} ({r['device']}, {r['dtype']}, {r['threads']} threads, torch {r['torch']}): "
        f"batch {r['batch']}, d_model {r['d_model']}, {r['heads']} heads"
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


# --- command line ----------------------------------------------------------------------------------------


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
        choices=[v.name for v in VARIANTS],
        default=None,
        help="forward+backward variants to run (default: all)",
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
    variants = [v for v in VARIANTS if args.variants is None or v.name in args.variants]
    flash_path = "flash-attn" if setup.device.type == "cuda" and flash_attn_module() else "torch SDPA"
    print(
        f"{common['hardware']}, {common['dtype']}, {common['threads']} threads; flash kernel via {flash_path}"
    )
    args.out_csv.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with args.out_csv.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        produced = [train_rows(setup, variants, args.lengths)]
        if args.decode_lengths:
            produced.append(decode_rows(setup, DECODE_VARIANTS, args.decode_lengths))
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
    peak = f"{int(row['peak_bytes']) / 2**20:9.1f} MiB" if row.get("peak_bytes") not in ("", None) else ""
    cache = (
        f"cache {int(row['cache_bytes']) / 2**10:.1f} KiB" if row.get("cache_bytes") not in ("", None) else ""
    )
    time_ms = f"{float(row['time_ms']):10.3f} ms" if row.get("time_ms") else ""
    where = f"{row['bench']:6} {row['variant']:16} {row['mode']:9} T={row['length']:<6}"
    return f"{where} {time_ms} {peak} {cache} {row['status']}"
