"""What the attention benchmark measures (:mod:`app.bench.attention`): the layer configurations, and the
rows of forward+backward and incremental-decoding measurements for each of them.

A :class:`KernelCase` is one self-attention layer configuration: a registered kernel with its options
and a key/value head count. Forward+backward rows time the layer (or its kernel alone on projected q, k,
v) and measure the peak memory one call adds; decoding rows time one query per step against a KV cache
(or the recurrent state of linear attention) and recomputation without one.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from app.attention import AttentionCache, MultiHeadAttention, build_kernel
from app.attention.registry import kernel_class
from app.bench.memory import PEAK_UNMEASURED, is_out_of_memory, peak_bytes
from app.bench.timing import median_ms, synchronize


@dataclass(frozen=True)
class KernelCase:
    """One attention layer configuration: a registered kernel, its options and the kv head count."""

    name: str
    kernel: str
    options: dict[str, Any] = field(default_factory=dict)
    kv_heads: int | None = None  # None = MHA


TRAIN_CASES = [
    KernelCase("eager", "eager"),
    KernelCase("sdpa", "sdpa"),
    KernelCase("flash", "flash", {"backend": "auto"}),
    # FlexAttention (compiled on CUDA; on a CPU fwd+bwd runs its dense fallback, see kernels/flex_ops.py)
    KernelCase("flex", "flex"),
    KernelCase("sparse_window256", "sparse", {"pattern": "sliding_window", "window": 256}),
    # the same window as FlexAttention block sparsity: 128 x 128 tiles outside the band are skipped
    KernelCase(
        "sparse_window256_flex", "sparse", {"pattern": "sliding_window", "window": 256, "backend": "flex"}
    ),
    KernelCase(
        "sparse_window256_recompute",
        "sparse",
        {"pattern": "sliding_window", "window": 256, "recompute": True},
    ),
    KernelCase("linear_elu", "linear", {"feature_map": "elu"}),
    KernelCase("linear_favor", "linear", {"feature_map": "favor", "num_features": 64}),
    KernelCase("gqa_sdpa_kv2", "sdpa", kv_heads=2),
    # Linformer's E, F cover the longest benchmark length (16,384); shorter inputs use their first columns.
    KernelCase("linformer_k256", "linformer", {"k": 256, "sharing": "headwise", "max_len": 16384}),
    # Reformer's LSH: chunks of 64, 4 hash rounds; 64 buckets average 64 keys each at 4,096 tokens.
    KernelCase("lsh_c64_h4", "lsh", {"chunk_size": 64, "n_hashes": 4, "n_buckets": 64}),
    KernelCase(
        "lsh_c64_h4_recompute", "lsh", {"chunk_size": 64, "n_hashes": 4, "n_buckets": 64, "recompute": True}
    ),
    # The paper's shared-QK form (conf/attention/lsh.yaml's default): keys are the unit-length queries.
    KernelCase("lsh_qk_c64_h4", "lsh", {"chunk_size": 64, "n_hashes": 4, "n_buckets": 64, "shared_qk": True}),
    KernelCase(
        "lsh_qk_c64_h4_recompute",
        "lsh",
        {"chunk_size": 64, "n_hashes": 4, "n_buckets": 64, "shared_qk": True, "recompute": True},
    ),
]
DECODE_CASES = [
    KernelCase("mha_sdpa", "sdpa"),
    KernelCase("gqa_sdpa_kv2", "sdpa", kv_heads=2),
    KernelCase("linear_elu", "linear", {"feature_map": "elu"}),
    KernelCase("lsh_c64_h4", "lsh", {"chunk_size": 64, "n_hashes": 4, "n_buckets": 64}),
    KernelCase("lsh_qk_c64_h4", "lsh", {"chunk_size": 64, "n_hashes": 4, "n_buckets": 64, "shared_qk": True}),
]


def runnable(cases: list[KernelCase], causal: bool) -> list[KernelCase]:
    """The cases whose kernel can run the benchmark's masking (Linformer cannot be causal)."""
    return [case for case in cases if not causal or kernel_class(case.kernel).capabilities.causal]


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

    def time_ms(self, run: Callable[[], Any]) -> float:
        """Median milliseconds of ``run`` over the setup's repeats, after its warm-up calls."""
        return median_ms(run, repeats=self.repeats, warmup=self.warmup, device=self.device)


def make_layer(case: KernelCase, setup: Setup) -> MultiHeadAttention:
    """The case's self-attention layer on the setup's device and dtype, with seeded weights."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        d_model=setup.d_model,
        num_heads=setup.heads,
        num_kv_heads=case.kv_heads,
        kernel=build_kernel(case.kernel, **case.options),
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


def timed_row(time_ms: float, peak: int | None) -> dict[str, Any]:
    """The measured cells of a row; a peak that could not be measured says so in the cell and the status."""
    if peak is None:
        status = "ok; peak memory not measured (the profiler recorded no allocation)"
        return {"time_ms": f"{time_ms:.3f}", "peak_bytes": PEAK_UNMEASURED, "status": status}
    return {"time_ms": f"{time_ms:.3f}", "peak_bytes": peak, "status": "ok"}


# --- forward + backward ----------------------------------------------------------------------------------


def train_rows(setup: Setup, cases: list[KernelCase], lengths: list[int]) -> Iterator[dict[str, Any]]:
    """One row per (case, length): forward+backward time and peak memory, or why it was skipped."""
    for case in cases:
        layer = make_layer(case, setup)
        failed_at: int | None = None
        for length in lengths:
            row = {"bench": "train", "variant": case.name, "kernel": case.kernel, "length": length}
            mode = "kernel fwd+bwd" if setup.kernel_only else "fwd+bwd"
            row |= {"kv_heads": case.kv_heads or setup.heads, "mode": mode, "cache_bytes": ""}
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
    """Forward+backward of the whole layer on a random input (B, T, D): median time and peak memory."""
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

    time_ms = setup.time_ms(step)
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
        keys = layer.kernel.shared_keys(q) if layer.kernel.shared_qk else k  # shared QK: from the queries
        layer.kernel(q, keys, v, causal=setup.causal).context.backward(grad)

    time_ms = setup.time_ms(step)
    return timed_row(time_ms, peak_bytes(step, setup.device))


# --- incremental decoding --------------------------------------------------------------------------------


def decode_rows(setup: Setup, cases: list[KernelCase], lengths: list[int]) -> Iterator[dict[str, Any]]:
    """Per-step time at each target length, with a cache and by recomputation, and the cache size."""
    for case in cases:
        layer = make_layer(case, setup).eval()
        for length in lengths:
            row = {"bench": "decode", "variant": case.name, "kernel": case.kernel, "length": length}
            row |= {"kv_heads": case.kv_heads or setup.heads, "peak_bytes": "", "status": "ok"}
            gen = torch.Generator(device=setup.device).manual_seed(0)
            x = torch.randn(
                setup.batch, length, setup.d_model, generator=gen, device=setup.device, dtype=setup.dtype
            )
            with torch.no_grad():
                cached_ms, cache_bytes = time_cached_steps(layer, x, setup)
                recompute_ms = setup.time_ms(functools.partial(layer, x, causal=True))
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

    def run() -> tuple[float, AttentionCache]:
        cache = layer.kernel.new_cache(cross=False)
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
