"""Tests for the sparse, linear and flash attention kernels, each against a float64 reference.

The references are written here from the formulas: masked softmax attention under an explicit dense
mask (sparse, flash) and the quadratic form of softmax-free attention (linear).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.configs import CONF_DIR, SMALL_MODEL
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import Tensor

from app.attention import AttentionConfigError, MultiHeadAttention, build_kernel
from app.attention.cache import WindowCache
from app.attention.config import site_specs
from app.attention.kernels import flash as flash_module
from app.attention.kernels.linear import LinearAttention, orthogonal_random_features
from app.attention.kernels.sparse import (
    PATTERNS,
    SparseAttention,
    pattern_covers_all,
    pattern_mask,
    random_key_blocks,
)
from app.models import build_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")


# --- shared inputs and references -----------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    heads: int = 4
    kv_heads: int = 4
    tq: int = 11
    tk: int = 11
    padded: bool = False
    causal: bool = False


CASES = {
    "plain": Case(),
    "key_padding": Case(tq=7, tk=11, padded=True),
    "causal": Case(causal=True),
    "causal_padded": Case(padded=True, causal=True),
    "causal_tq_lt_tk": Case(tq=4, tk=11, causal=True),
    "causal_tq_gt_tk": Case(tq=9, tk=6, causal=True, padded=True),
    "gqa_2_of_4": Case(kv_heads=2, tq=6, tk=11, padded=True, causal=True),
    "gqa_2_of_4_full": Case(kv_heads=2, padded=True),
}


def random_inputs(case: Case, *, dtype: torch.dtype = torch.float64, seed: int = 0, dim: int = 8):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, case.heads, case.tq, dim, generator=gen, dtype=dtype)
    k = torch.randn(2, case.kv_heads, case.tk, dim, generator=gen, dtype=dtype)
    v = torch.randn(2, case.kv_heads, case.tk, dim, generator=gen, dtype=dtype)
    key_mask = None
    if case.padded:
        lengths = torch.tensor([case.tk, case.tk - 4])
        key_mask = torch.arange(case.tk)[None, :] < lengths[:, None]  # (B, Tk)
        key_mask[0, 1] = False  # padding is not always a suffix
    return q, k, v, key_mask


def explicit_mask(case: Case, key_mask: Tensor | None, extra: Tensor | None = None) -> Tensor:
    """(B, 1, Tq, Tk): key padding & causal (queries are the last Tq positions) & an optional pattern."""
    mask = torch.ones(2, 1, case.tq, case.tk, dtype=torch.bool)
    if key_mask is not None:
        mask = mask & key_mask[:, None, None, :]
    if case.causal:
        rows = torch.arange(case.tq)[:, None] + case.tk - case.tq
        mask = mask & (torch.arange(case.tk)[None, :] <= rows)
    return mask if extra is None else mask & extra


def shared_kv(k: Tensor, heads: int) -> Tensor:
    """Query head h uses kv head h // (H / Hkv)."""
    return k.repeat_interleave(heads // k.size(1), dim=1)


def softmax_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d)) over the keys ``mask`` allows; rows with no allowed key are zero."""
    k, v = shared_kv(k, q.size(1)), shared_kv(v, q.size(1))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~mask, -1e30)
    weights = torch.where(mask, torch.softmax(scores, dim=-1), 0.0)
    return weights @ v, weights


def assert_forward_and_gradients_match(
    run: Callable[..., Tensor],
    reference: Callable[..., Tensor],
    inputs: tuple[Tensor, ...],
    tol: float = 1e-9,
) -> None:
    ours = [t.clone().requires_grad_() for t in inputs]
    theirs = [t.clone().requires_grad_() for t in inputs]
    got, expected = run(*ours), reference(*theirs)
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    grad_out = torch.randn(expected.shape, generator=torch.Generator().manual_seed(5), dtype=expected.dtype)
    grads = torch.autograd.grad(got, ours, grad_out)
    ref_grads = torch.autograd.grad(expected, theirs, grad_out)
    for g, r, name in zip(grads, ref_grads, "qkv", strict=True):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol, msg=lambda m, n=name: f"d{n}: {m}")


def decode_step_by_step(kernel, *, steps: int = 12, kv_heads: int = 2, max_len: int | None = None):
    """Causal self-attention of a random sequence, in full and one query at a time against a KV cache."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(d_model=16, num_heads=4, num_kv_heads=kv_heads, kernel=kernel).double().eval()
    x = torch.randn(2, steps, 16, dtype=torch.float64)
    with torch.no_grad():
        full, _ = layer(x, causal=True)
        cache = kernel.new_cache(cross=False) if max_len is None else WindowCache(max_len=max_len)
        stepped = torch.cat(
            [layer(x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(steps)], dim=1
        )
    return full, stepped, cache


# --- sparse ------------------------------------------------------------------------------------------

SMALL = {"window": 2, "stride": 3, "summary": 1, "block": 4, "num_random_blocks": 1, "seed": 3}
SPARSE_SETTINGS = {
    "sliding_window": {"pattern": "sliding_window"},
    "strided": {"pattern": "strided"},
    "fixed": {"pattern": "fixed"},
    "global_window": {"pattern": "global_window", "num_global": 2},
    "random_blocks": {"pattern": "random_blocks"},
    "bigbird": {"pattern": "random_blocks", "num_global": 1},
    "strided_global": {"pattern": "strided", "num_global": 1},
}


def sparse_kernel(name: str, **overrides) -> SparseAttention:
    return build_kernel("sparse", **{**SMALL, **SPARSE_SETTINGS[name], **overrides})


def expected_visible(kernel: SparseAttention, p: int, j: int, tk: int, causal: bool) -> bool:
    """The patterns element by element, as the papers define them (positions p of queries, j of keys)."""
    s = kernel.settings
    if causal and j > p:
        return False
    if 0 <= p < s.num_global or j < s.num_global:  # queries before the first key (p < 0) are not global
        return True
    local = abs(p - j) <= s.window
    if s.pattern in ("sliding_window", "global_window"):
        return local
    if s.pattern == "strided":
        return local or (p - j) % s.stride == 0
    if s.pattern == "fixed":
        return p // s.stride == j // s.stride or j % s.stride >= s.stride - s.summary
    blocks = random_key_blocks(s, p // s.block, num_key_blocks=math.ceil(tk / s.block), causal=causal)
    return local or j // s.block in blocks


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
@pytest.mark.parametrize(("tq", "tk"), [(13, 13), (5, 13), (13, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_pattern_mask_is_the_papers_pattern(name: str, tq: int, tk: int, causal: bool) -> None:
    kernel = sparse_kernel(name)
    mask = pattern_mask(kernel.settings, tq, tk, causal=causal)
    expected = torch.tensor(
        [[expected_visible(kernel, i + tk - tq, j, tk, causal) for j in range(tk)] for i in range(tq)]
    )
    assert torch.equal(mask, expected)
    if tq == tk and not causal and kernel.settings.num_global == 0:
        assert not mask.all()  # a real restriction at this size, not dense attention in disguise


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
def test_the_dense_shortcut_is_taken_only_where_the_pattern_hides_nothing(name: str) -> None:
    """pattern_covers_all (which sends a call to dense attention) claims full coverage only where the
    explicit pattern shows it, and finds it for short calls: a decoding step over a window-sized cache."""
    settings = sparse_kernel(name).settings
    covered = []
    for tq in range(1, 9):
        for tk in range(1, 9):
            if pattern_covers_all(settings, tq, tk):
                assert pattern_mask(settings, tq, tk, causal=False).all(), (tq, tk)
                covered.append((tq, tk))
    reach = settings.stride if settings.pattern == "fixed" else settings.window + 1  # 3 keys
    assert (1, reach) in covered and (1, reach + 1) not in covered  # one query over a truncated cache


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
def test_sparse_equals_its_blockwise_form_where_the_dense_shortcut_applies(name: str) -> None:
    """Where the shortcut applies, the answer is the one the blockwise path gives (forced here by a
    pattern too narrow to take it, whose global positions nevertheless reach every key)."""
    case = Case(heads=4, kv_heads=2, tq=3, tk=3, causal=True, padded=True)
    q, k, v, key_mask = random_inputs(case)
    shortcut = sparse_kernel(name)(q, k, v, key_mask=key_mask, causal=True, need_weights=True)
    narrow = sparse_kernel(name, window=0, stride=1, num_global=3)
    blockwise = narrow(q, k, v, key_mask=key_mask, causal=True, need_weights=True)
    assert pattern_covers_all(sparse_kernel(name).settings, 3, 3)
    assert not pattern_covers_all(narrow.settings, 3, 3)
    torch.testing.assert_close(shortcut.context, blockwise.context, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(shortcut.weights, blockwise.weights, rtol=1e-12, atol=1e-12)


def test_sliding_window_is_inclusive_and_one_sided() -> None:
    kernel = build_kernel("sparse", pattern="sliding_window", window=2)
    mask = pattern_mask(kernel.settings, 9, 9, causal=False)
    assert mask[4].nonzero().flatten().tolist() == [2, 3, 4, 5, 6]  # 2 * window + 1 keys
    causal = pattern_mask(kernel.settings, 9, 9, causal=True)
    assert causal[4].nonzero().flatten().tolist() == [2, 3, 4]  # the query and `window` keys before it


def test_global_tokens_attend_and_are_attended_by_all() -> None:
    kernel = build_kernel("sparse", pattern="global_window", window=1, num_global=2)
    mask = pattern_mask(kernel.settings, 10, 10, causal=False)
    assert mask[:2].all() and mask[:, :2].all()
    assert mask[6].nonzero().flatten().tolist() == [0, 1, 5, 6, 7]


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_sparse_matches_masked_softmax_reference(name: str, case: Case) -> None:
    kernel = sparse_kernel(name)
    q, k, v, key_mask = random_inputs(case)
    pattern = pattern_mask(kernel.settings, case.tq, case.tk, causal=case.causal)
    mask = explicit_mask(case, key_mask, pattern)

    def run(q, k, v):
        return kernel(q, k, v, key_mask=key_mask, causal=case.causal).context

    assert_forward_and_gradients_match(run, lambda q, k, v: softmax_reference(q, k, v, mask)[0], (q, k, v))


# backend=flex: the same patterns as FlexAttention block masks. Forward through flex_attention itself (without
# autograd: torch has no CPU FlexAttention backward); gradients, on the CPU, through the dense form of the
# same mask_mod. One case a pattern (each call traces the unfused reference anew): padded keys, causal, GQA
# and fewer queries than keys; positions before the first key run in test_attention.py (flex) and below.
@pytest.mark.parametrize("name", SPARSE_SETTINGS)
def test_sparse_flex_backend_matches_masked_softmax_reference(name: str) -> None:
    kernel, case = sparse_kernel(name, backend="flex"), CASES["gqa_2_of_4"]
    q, k, v, key_mask = random_inputs(case)
    mask = explicit_mask(case, key_mask, pattern_mask(kernel.settings, case.tq, case.tk, causal=case.causal))
    with torch.no_grad():
        got = kernel(q, k, v, key_mask=key_mask, causal=case.causal).context
    torch.testing.assert_close(got, softmax_reference(q, k, v, mask)[0], rtol=1e-9, atol=1e-9)

    def run(q, k, v):
        return kernel(q, k, v, key_mask=key_mask, causal=case.causal).context

    assert_forward_and_gradients_match(run, lambda q, k, v: softmax_reference(q, k, v, mask)[0], (q, k, v))


@torch.no_grad()
def test_sparse_flex_backend_before_the_first_key_and_without_causality() -> None:
    """Negative query positions (never global, no random blocks) and a non-causal padded call."""
    for name, case in (("bigbird", CASES["causal_tq_gt_tk"]), ("strided_global", CASES["key_padding"])):
        kernel = sparse_kernel(name, backend="flex")
        q, k, v, key_mask = random_inputs(case)
        mask = explicit_mask(
            case, key_mask, pattern_mask(kernel.settings, case.tq, case.tk, causal=case.causal)
        )
        got = kernel(q, k, v, key_mask=key_mask, causal=case.causal).context
        torch.testing.assert_close(got, softmax_reference(q, k, v, mask)[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
def test_sparse_weights_are_the_dense_masked_softmax(name: str) -> None:
    case = CASES["gqa_2_of_4"]
    kernel = sparse_kernel(name)
    q, k, v, key_mask = random_inputs(case)
    mask = explicit_mask(case, key_mask, pattern_mask(kernel.settings, case.tq, case.tk, causal=True))
    out = kernel(q, k, v, key_mask=key_mask, causal=True, need_weights=True)
    expected_context, expected_weights = softmax_reference(q, k, v, mask)
    assert out.weights.shape == (2, 4, case.tq, case.tk)
    torch.testing.assert_close(out.weights, expected_weights, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.context, expected_context, rtol=1e-9, atol=1e-12)
    assert kernel(q, k, v, key_mask=key_mask, causal=True).weights is None


# random_blocks ties its key blocks to `block`, so only the other patterns may vary it freely.
@pytest.mark.parametrize("name", [n for n, o in SPARSE_SETTINGS.items() if o["pattern"] != "random_blocks"])
def test_sparse_result_does_not_depend_on_the_query_block_size(name: str) -> None:
    case = CASES["causal_padded"]
    q, k, v, key_mask = random_inputs(case)
    outs = [
        sparse_kernel(name, block=block)(q, k, v, key_mask=key_mask, causal=True).context
        for block in (1, 3, 64)
    ]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outs[0], outs[2], rtol=1e-12, atol=1e-12)


def saved_bytes_and_grads(kernel: SparseAttention, inputs: tuple, key_mask, dropout_p: float):
    """Bytes autograd keeps for the backward pass (distinct storages), the output and input gradients."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    leaves = [t.detach().requires_grad_() for t in inputs]
    torch.manual_seed(7)  # the same dropout masks for every run
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = kernel(*leaves, key_mask=key_mask, causal=True, dropout_p=dropout_p).context
    grads = torch.autograd.grad(out.square().sum(), leaves)
    return sum(saved.values()), out.detach(), grads


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_sparse_recompute_gives_the_same_result_and_gradients_with_less_saved(
    name: str, dropout_p: float
) -> None:
    case = CASES["causal_padded"]
    q, k, v, key_mask = random_inputs(case)
    stored = saved_bytes_and_grads(sparse_kernel(name, block=3), (q, k, v), key_mask, dropout_p)
    recomputed = saved_bytes_and_grads(
        sparse_kernel(name, block=3, recompute=True), (q, k, v), key_mask, dropout_p
    )
    torch.testing.assert_close(recomputed[1], stored[1], rtol=1e-12, atol=1e-12)
    for got, expected in zip(recomputed[2], stored[2], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert recomputed[0] < stored[0]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_sparse_with_a_window_covering_everything_equals_the_eager_kernel(case: Case) -> None:
    q, k, v, key_mask = random_inputs(case, dtype=torch.float32, seed=1)
    expected = build_kernel("eager")(q, k, v, key_mask=key_mask, causal=case.causal).context
    got = build_kernel("sparse", window=case.tk, block=4)(q, k, v, key_mask=key_mask, causal=case.causal)
    torch.testing.assert_close(got.context, expected, rtol=1e-5, atol=1e-6)


def test_random_blocks_are_seeded_and_causal_draws_ignore_later_keys() -> None:
    settings = sparse_kernel("random_blocks", num_random_blocks=2).settings
    draws = [random_key_blocks(settings, qb, num_key_blocks=8, causal=False) for qb in range(8)]
    assert all(len(d) == 2 and all(0 <= b < 8 for b in d) for d in draws)
    assert draws == [random_key_blocks(settings, qb, num_key_blocks=8, causal=False) for qb in range(8)]
    other_seed = sparse_kernel("random_blocks", num_random_blocks=2, seed=4).settings
    assert draws != [random_key_blocks(other_seed, qb, num_key_blocks=8, causal=False) for qb in range(8)]
    for qb in range(8):
        causal = random_key_blocks(settings, qb, num_key_blocks=8, causal=True)
        assert causal == random_key_blocks(settings, qb, num_key_blocks=99, causal=True)
        assert len(causal) == min(2, qb + 1) and max(causal) <= qb
    # A causal mask over a prefix of the keys is the corresponding corner of the full mask.
    full = pattern_mask(settings, 20, 20, causal=True)
    assert torch.equal(pattern_mask(settings, 3, 12, causal=True), full[9:12, :12])


def test_sparse_cache_window_values() -> None:
    assert build_kernel("sparse", pattern="sliding_window", window=5).cache_window() == 6
    assert build_kernel("sparse", pattern="sliding_window", window=5, num_global=1).cache_window() is None
    for pattern in ("strided", "fixed", "global_window", "random_blocks"):
        assert build_kernel("sparse", pattern=pattern, num_global=1).cache_window() is None


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
def test_sparse_cached_decoding_equals_full_recomputation(name: str) -> None:
    kernel = sparse_kernel(name)
    window = kernel.cache_window()
    full, stepped, cache = decode_step_by_step(kernel, max_len=window)
    torch.testing.assert_close(stepped, full, rtol=1e-10, atol=1e-12)
    if name == "sliding_window":
        assert window == SMALL["window"] + 1
        assert cache.length() == window < 12  # the cache really was truncated


def test_sliding_window_cache_one_shorter_than_cache_window_is_wrong() -> None:
    # Pins the off-by-one: window + 1 positions are needed, window are not enough.
    kernel = sparse_kernel("sliding_window")
    window = SMALL["window"]
    full, stepped, _ = decode_step_by_step(kernel, max_len=kernel.cache_window() - 1)
    torch.testing.assert_close(stepped[:, :window], full[:, :window])  # fewer than window + 1 keys so far
    assert not torch.allclose(stepped[:, window], full[:, window], atol=1e-6)  # key 0 was dropped too soon


@pytest.mark.parametrize("name", SPARSE_SETTINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_rows_without_keys_are_zero_with_finite_gradients(name: str, dtype: torch.dtype) -> None:
    kernel = sparse_kernel(name)
    q, k, v, _ = random_inputs(Case(kv_heads=2, tq=6, tk=9), dtype=dtype)
    key_mask = torch.zeros(2, 9, dtype=torch.bool)
    key_mask[0, 0] = True  # row 0 sees key 0 only where the pattern allows; row 1 sees nothing
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    for causal in (False, True):
        out = kernel(*inputs, key_mask=key_mask, causal=causal, need_weights=True)
        assert torch.isfinite(out.context).all() and torch.isfinite(out.weights).all()
        assert torch.all(out.context[1] == 0) and torch.all(out.weights[1] == 0)
        grads = torch.autograd.grad(out.context.sum(), inputs)
        assert all(torch.isfinite(g).all() for g in grads)
        assert torch.all(grads[0][1] == 0)


def test_sparse_queries_before_the_first_key_are_zero() -> None:
    q, k, v, _ = random_inputs(Case(tq=7, tk=3), dtype=torch.float32)
    out = build_kernel("sparse", window=1, block=2)(q, k, v, causal=True)
    assert torch.all(out.context[:, :, :4] == 0)
    assert torch.all(out.context[:, :, 4:].abs().sum(-1) > 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"pattern": "diagonal"},
            "unknown sparse attention pattern 'diagonal'; valid choices: sliding_window, "
            "strided, fixed, global_window, random_blocks",
        ),
        ({"window": -1}, r"window=-1 must be an integer >= 0"),
        ({"stride": 0}, r"stride=0 must be an integer >= 1"),
        ({"block": 2.5}, r"block=2.5 must be an integer >= 1"),
        ({"num_global": True}, r"num_global=True must be an integer >= 0"),
        ({"stride": 4, "summary": 5}, r"summary=5 must be at most stride=4"),
        ({"pattern": "global_window"}, r"'global_window' needs num_global >= 1, got 0"),
        ({"windw": 3}, r"'sparse' rejected options \{'windw': 3\}"),
    ],
)
def test_sparse_bad_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(AttentionConfigError, match=message):
        build_kernel("sparse", **options)


def test_sliding_window_forward_never_allocates_a_dense_score_matrix() -> None:
    # T = 2048 with a 32-wide window: the dense (T, T) float32 scores would take 16 MiB. Eager, profiled the
    # same way, shows that the profiler does see allocations of that size.
    length, window = 2048, 32
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, length, 4, generator=gen) for _ in range(3))
    dense_bytes = length * length * 4

    def largest_allocation(kernel) -> int:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as prof:
            kernel(q, k, v, causal=True)
        return max(event.cpu_memory_usage for event in prof.events())  # per call, children included

    assert largest_allocation(build_kernel("eager")) >= dense_bytes
    sparse = build_kernel("sparse", pattern="sliding_window", window=window, block=128)
    assert largest_allocation(sparse) < dense_bytes / 100


# --- linear -----------------------------------------------------------------------------------------------


def feature_map_reference(kernel: LinearAttention, x: Tensor) -> Tensor:
    """phi(x) as the papers write it: elu(x) + 1, or exp(W x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4)."""
    if kernel.feature_map == "elu":
        return torch.where(x > 0, x + 1, torch.exp(x))
    x = x / x.size(-1) ** 0.25
    if kernel.learned:  # query head h (and keys shared out to it) use kv head h // G's W
        w = kernel.weight.to(x.dtype).repeat_interleave(x.size(1) // kernel.weight.size(0), dim=0)
    else:
        w = orthogonal_random_features(kernel.num_features, x.size(-1), kernel.seed).to(x.dtype)
    return torch.exp(x @ w.transpose(-1, -2) - (x * x).sum(-1, keepdim=True) / 2) / math.sqrt(
        kernel.num_features
    )


def linear_reference(kernel: LinearAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """The quadratic form: A = mask * (phi(Q) phi(K)^T), out = A V / (row sums of A + eps)."""
    k, v = shared_kv(k, q.size(1)), shared_kv(v, q.size(1))
    scores = feature_map_reference(kernel, q) @ feature_map_reference(kernel, k).transpose(-1, -2)
    scores = scores * mask
    return (scores @ v) / (scores.sum(-1, keepdim=True) + kernel.eps)


LINEAR_OPTIONS = {
    "elu": {"feature_map": "elu", "chunk_size": 4},
    "favor": {"feature_map": "favor", "num_features": 16, "chunk_size": 4, "seed": 7},
    "favor_learned": {
        "feature_map": "favor",
        "num_features": 16,
        "chunk_size": 4,
        "seed": 7,
        "learned": True,
    },
}


def linear_kernel(options: dict, case: Case, dim: int = 8) -> LinearAttention:
    """The kernel bound to ``case``'s heads; a learned map moved off its random draw, so the test sees W."""
    kernel = build_kernel("linear", **options)
    kernel.bind(num_heads=case.heads, num_kv_heads=case.kv_heads, head_dim=dim)
    if kernel.weight is not None:
        with torch.no_grad():
            kernel.weight.add_(
                0.3 * torch.randn(kernel.weight.shape, generator=torch.Generator().manual_seed(1))
            )
    return kernel


@pytest.mark.parametrize("options", LINEAR_OPTIONS.values(), ids=LINEAR_OPTIONS.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_linear_matches_the_quadratic_form(options: dict, case: Case) -> None:
    kernel = linear_kernel(options, case)
    q, k, v, key_mask = random_inputs(case)
    mask = explicit_mask(case, key_mask)

    def run(q, k, v):
        return kernel(q, k, v, key_mask=key_mask, causal=case.causal).context

    assert_forward_and_gradients_match(
        run, lambda q, k, v: linear_reference(kernel, q, k, v, mask), (q, k, v)
    )


@pytest.mark.parametrize("options", LINEAR_OPTIONS.values(), ids=LINEAR_OPTIONS.keys())
def test_linear_recurrent_step_equals_the_causal_form(options: dict) -> None:
    kernel = linear_kernel(options, Case(kv_heads=2))
    q, k, v, _ = random_inputs(Case(kv_heads=2, tq=10, tk=10))
    key_mask = torch.ones(2, 10, dtype=torch.bool)
    key_mask[1, 3] = key_mask[1, 7] = False  # holes in the middle of row 1
    full = kernel(q, k, v, key_mask=key_mask, causal=True).context
    expected = linear_reference(kernel, q, k, v, explicit_mask(Case(tq=10, tk=10, causal=True), key_mask))
    torch.testing.assert_close(full, expected, rtol=1e-9, atol=1e-10)
    state, steps = None, []
    for t in range(10):  # one position at a time
        sl = slice(t, t + 1)
        context, state = kernel.recurrent_step(
            state, q[:, :, sl], k[:, :, sl], v[:, :, sl], key_mask=key_mask[:, sl]
        )
        steps.append(context)
        assert state.kv.shape == (2, 2, kernel.num_features if options["feature_map"] == "favor" else 8, 8)
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-9, atol=1e-10)
    # Several positions per step: 7, then 3.
    _, prefix = kernel.recurrent_step(None, q[:, :, :7], k[:, :, :7], v[:, :, :7], key_mask=key_mask[:, :7])
    rest, _ = kernel.recurrent_step(prefix, q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], key_mask=key_mask[:, 7:])
    torch.testing.assert_close(rest, full[:, :, 7:], rtol=1e-9, atol=1e-10)
    reordered = prefix.reorder(torch.tensor([1, 1]))
    assert torch.equal(reordered.kv[0], prefix.kv[1]) and torch.equal(reordered.z[0], prefix.z[1])


@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_linear_causal_result_does_not_depend_on_the_chunk_size(chunk_size: int) -> None:
    q, k, v, key_mask = random_inputs(CASES["causal_padded"])
    expected = build_kernel("linear", chunk_size=4)(q, k, v, key_mask=key_mask, causal=True).context
    got = build_kernel("linear", chunk_size=chunk_size)(q, k, v, key_mask=key_mask, causal=True).context
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options", LINEAR_OPTIONS.values(), ids=LINEAR_OPTIONS.keys())
def test_linear_cached_decoding_equals_full_recomputation(options: dict) -> None:
    kernel = build_kernel("linear", **options)
    assert kernel.cache_window() is None
    full, stepped, _ = decode_step_by_step(kernel)
    torch.testing.assert_close(stepped, full, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("options", LINEAR_OPTIONS.values(), ids=LINEAR_OPTIONS.keys())
def test_linear_rows_without_keys_are_zero_with_finite_gradients(options: dict) -> None:
    kernel = linear_kernel(options, Case(kv_heads=2))
    q, k, v, _ = random_inputs(Case(kv_heads=2, tq=3, tk=5), dtype=torch.float32)
    key_mask = torch.tensor([[True] * 5, [False] * 5])
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    for causal in (False, True):
        out = kernel(*inputs, key_mask=key_mask, causal=causal)
        assert torch.isfinite(out.context).all() and torch.all(out.context[1] == 0)
        assert out.context[0].abs().sum() > 0
        grads = torch.autograd.grad(out.context.sum(), inputs)
        assert all(torch.isfinite(g).all() for g in grads)


def test_favor_estimates_softmax_attention() -> None:
    # Lemma 1 of Choromanski et al. 2021: with many features phi(q).phi(k) ~ exp(q.k / sqrt(d)).
    q, k, v, key_mask = random_inputs(Case(heads=1, kv_heads=1, tq=6, tk=6, padded=True), dim=4)
    q, k = q * 0.5, k * 0.5
    expected = softmax_reference(q, k, v, explicit_mask(Case(tq=6, tk=6, causal=True), key_mask))[0]
    approx = build_kernel("linear", feature_map="favor", num_features=4096)(
        q, k, v, key_mask=key_mask, causal=True
    )
    assert (approx.context - expected).abs().max() < 0.05
    crude = build_kernel("linear", feature_map="elu")(q, k, v, key_mask=key_mask, causal=True)
    assert (crude.context - expected).abs().max() > (approx.context - expected).abs().max()


def test_a_learned_feature_map_gets_the_gradient_of_the_quadratic_form() -> None:
    """W's gradient through the chunked causal scan and the reduced (non-causal) form equals the one
    through the plain quadratic form; a layer's W starts from the draw, FAVOR+'s softmax estimate."""
    for causal in (True, False):
        case = Case(kv_heads=2, padded=True, causal=causal)
        kernel = linear_kernel(LINEAR_OPTIONS["favor_learned"], case)
        q, k, v, key_mask = random_inputs(case)
        out = kernel(q, k, v, key_mask=key_mask, causal=causal).context
        (grad,) = torch.autograd.grad((out * out).sum(), [kernel.weight])
        expected = linear_reference(kernel, q, k, v, explicit_mask(case, key_mask))
        (expected_grad,) = torch.autograd.grad((expected * expected).sum(), [kernel.weight])
        torch.testing.assert_close(out, expected, rtol=1e-7, atol=1e-8)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6)
        assert grad.abs().sum() > 0
    layer = MultiHeadAttention(d_model=16, num_heads=4, num_kv_heads=2, kernel=build_kernel(
        "linear", feature_map="favor", num_features=16, seed=7, learned=True
    ))  # fmt: skip
    assert layer.kernel.weight.shape == (2, 16, 4) and layer.kernel.weight.requires_grad
    torch.testing.assert_close(layer.kernel.weight[1], orthogonal_random_features(16, 4, 8).float())


def test_favor_features_do_not_overflow_on_large_inputs() -> None:
    q, k, v, _ = random_inputs(Case(tq=6, tk=6), dtype=torch.float32, dim=64)
    kernel = build_kernel("linear", feature_map="favor", num_features=32)
    for scale in (1.0, 30.0):
        out = kernel(q * scale, k * scale, v, causal=True)
        assert torch.isfinite(out.context).all()
    half = kernel(q.half(), k.half(), v.half(), causal=False).context
    assert half.dtype == torch.float16 and torch.isfinite(half).all()


def test_linear_refuses_weights_and_weight_dropout() -> None:
    q, k, v, _ = random_inputs(Case())
    kernel = build_kernel("linear")
    assert not kernel.capabilities.returns_weights
    with pytest.raises(ValueError, match="cannot return attention weights"):
        kernel(q, k, v, need_weights=True)
    with pytest.raises(AttentionConfigError, match=r"no attention weights to drop \(dropout_p=0.1\)"):
        kernel(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"feature_map": "relu"}, "unknown linear attention feature_map 'relu'; valid choices: elu, favor"),
        ({"num_features": 0}, r"num_features=0 must be an integer >= 1"),
        ({"chunk_size": "8"}, r"chunk_size='8' must be an integer >= 1"),
        ({"eps": 0.0}, r"eps=0.0 must be a number > 0"),
        ({"seed": 1.5}, r"seed=1.5 must be an integer"),
        ({"redraw": True}, r"'linear' rejected options \{'redraw': True\}"),
        ({"learned": True}, r"learned=True must be true or false, and true only with feature_map=favor"),
        ({"feature_map": "favor", "learned": "yes"}, r"learned='yes' must be true or false"),
    ],
)
def test_linear_bad_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(AttentionConfigError, match=message):
        build_kernel("linear", **options)


# --- flash ------------------------------------------------------------------------------------------------

BACKENDS = ["auto", "flash", "efficient", "math"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_flash_matches_masked_softmax_reference(backend: str, case: Case) -> None:
    kernel = build_kernel("flash", backend=backend)
    q, k, v, key_mask = random_inputs(case)
    mask = explicit_mask(case, key_mask)

    def run(q, k, v):
        return kernel(q, k, v, key_mask=key_mask, causal=case.causal).context

    assert_forward_and_gradients_match(run, lambda q, k, v: softmax_reference(q, k, v, mask)[0], (q, k, v))


@pytest.fixture
def sdpa_only_in_math(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make SDPA refuse every backend but math, as PyTorch does when no enabled kernel fits a call."""
    real = F.scaled_dot_product_attention
    refusals = []

    def refusing(*args, **kwargs):
        if not torch.backends.cuda.math_sdp_enabled():
            refusals.append(1)
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(*args, **kwargs)

    monkeypatch.setattr(flash_module.F, "scaled_dot_product_attention", refusing)
    return refusals


def test_flash_falls_back_to_math_and_warns_once(sdpa_only_in_math, caplog: pytest.LogCaptureFixture) -> None:
    kernel = build_kernel("flash", backend="efficient")
    case = CASES["causal_padded"]
    q, k, v, key_mask = random_inputs(case)
    expected = softmax_reference(q, k, v, explicit_mask(case, key_mask))[0]
    with caplog.at_level(logging.WARNING, logger=flash_module.__name__):
        for _ in range(3):
            got = kernel(q, k, v, key_mask=key_mask, causal=True).context
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)
        kernel(q, k, v, causal=False)  # another call signature: tried again, but not logged again
    warnings = [r for r in caplog.records if "falling back to 'math'" in r.getMessage()]
    assert len(warnings) == 1
    assert "'efficient'" in warnings[0].getMessage() and "No available kernel" in warnings[0].getMessage()
    assert len(sdpa_only_in_math) == 2  # a refused signature is not retried
    caplog.clear()
    build_kernel("flash", backend="flash")(q, k, v)  # a new kernel instance logs its own fallback
    assert sum("falling back" in r.getMessage() for r in caplog.records) == 1


def test_flash_math_and_auto_do_not_fall_back(sdpa_only_in_math, caplog: pytest.LogCaptureFixture) -> None:
    q, k, v, _ = random_inputs(Case())
    with caplog.at_level(logging.WARNING, logger=flash_module.__name__):
        build_kernel("flash", backend="math")(q, k, v)
    assert not sdpa_only_in_math and not caplog.records


def test_flash_other_runtime_errors_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(flash_module.F, "scaled_dot_product_attention", broken)
    q, k, v, _ = random_inputs(Case())
    with pytest.raises(RuntimeError, match="illegal memory access"):
        build_kernel("flash", backend="flash")(q, k, v)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_flash_rows_without_keys_are_zero_with_finite_gradients(backend: str, dtype: torch.dtype) -> None:
    kernel = build_kernel("flash", backend=backend)
    q, k, v, _ = random_inputs(Case(kv_heads=2, tq=3, tk=5), dtype=dtype)
    key_mask = torch.tensor([[True] * 5, [False] * 5])
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    for causal in (False, True):
        out = kernel(*inputs, key_mask=key_mask, causal=causal)
        assert torch.isfinite(out.context).all() and torch.all(out.context[1] == 0)
        grads = torch.autograd.grad(out.context.sum(), inputs)
        assert all(torch.isfinite(g).all() for g in grads)
        assert torch.all(grads[0][1] == 0)
    q5, k3, v3, _ = random_inputs(Case(tq=5, tk=3), dtype=dtype)
    early = kernel(q5, k3, v3, causal=True).context  # the first two queries come before every key
    assert torch.isfinite(early).all() and torch.all(early[:, :, :2] == 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flash_cached_decoding_equals_full_recomputation(backend: str) -> None:
    full, stepped, _ = decode_step_by_step(build_kernel("flash", backend=backend))
    torch.testing.assert_close(stepped, full, rtol=1e-10, atol=1e-12)


def test_flash_refuses_weights_and_bad_backends() -> None:
    q, k, v, _ = random_inputs(Case())
    with pytest.raises(ValueError, match="cannot return attention weights"):
        build_kernel("flash")(q, k, v, need_weights=True)
    with pytest.raises(
        AttentionConfigError, match="backend 'cudnn'; valid choices: auto, flash, efficient, math"
    ):
        build_kernel("flash", backend="cudnn")


def fake_flash_attn() -> SimpleNamespace:
    """flash_attn's two entry points, on the CPU and in float64, written from their documented contract."""

    def attend(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:  # (T, H, D) layouts of one sequence
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        mask = torch.ones(q.size(1), k.size(1), dtype=torch.bool)
        if causal:  # bottom-right aligned, as flash-attn >= 2.1
            mask = torch.arange(k.size(1))[None, :] <= torch.arange(q.size(1))[:, None] + k.size(1) - q.size(
                1
            )
        return softmax_reference(q[None], k[None], v[None], mask)[0][0].transpose(0, 1)

    def flash_attn_func(q, k, v, dropout_p=0.0, causal=False):
        return torch.stack([attend(q[b], k[b], v[b], causal) for b in range(q.size(0))])

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, causal=False):
        assert cu_q.dtype == cu_k.dtype == torch.int32 and max_k >= int((cu_k[1:] - cu_k[:-1]).max())
        outs = [
            attend(q[cu_q[b] : cu_q[b + 1]], k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]], causal)
            for b in range(len(cu_q) - 1)
        ]
        return torch.cat(outs)

    return SimpleNamespace(flash_attn_func=flash_attn_func, flash_attn_varlen_func=flash_attn_varlen_func)


@pytest.mark.parametrize("case", [CASES["key_padding"], CASES["gqa_2_of_4_full"], CASES["causal_tq_lt_tk"]])
def test_flash_attn_path_unpads_keys_correctly(monkeypatch: pytest.MonkeyPatch, case: Case) -> None:
    # The flash-attn path needs a GPU; its bookkeeping (unpadding, cu_seqlens, layouts) is checked here
    # against a CPU stand-in of flash-attn's documented contract.
    monkeypatch.setattr(flash_module, "flash_attn_module", fake_flash_attn)
    q, k, v, key_mask = random_inputs(case)
    if key_mask is not None:
        key_mask[1] = False  # a sequence without any key
    got = build_kernel("flash")._flash_attn(q, k, v, key_mask, case.causal, 0.0)
    expected = softmax_reference(q, k, v, explicit_mask(case, key_mask))[0]
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (fused kernels, flash-attn)")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case", [CASES["key_padding"], CASES["causal"], CASES["gqa_2_of_4"]], ids=["key_padding", "causal", "gqa"]
)
def test_flash_on_gpu_in_half_precision(backend: str, case: Case) -> None:
    q, k, v, key_mask = random_inputs(case, dim=64)
    mask = explicit_mask(case, key_mask)
    expected = softmax_reference(q, k, v, mask)[0]
    half = [t.cuda().half().requires_grad_() for t in (q, k, v)]
    out = build_kernel("flash", backend=backend)(
        *half, key_mask=None if key_mask is None else key_mask.cuda(), causal=case.causal
    )
    torch.testing.assert_close(out.context.double().cpu(), expected, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(out.context.float().sum(), half)
    assert all(torch.isfinite(g).all() for g in grads)


# --- configs and the model -------------------------------------------------------------------------------


def compose_attention(option: str, tmp_path: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "train", overrides=[f"output_dir={tmp_path}", f"attention={option}", *SMALL_MODEL, *overrides]
        )
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("option", ["sparse", "linear", "flash"])
def test_new_attention_configs_compose_and_build(option: str, tmp_path: Path) -> None:
    config = compose_attention(option, tmp_path)
    specs = site_specs(config["attention"])
    if option == "sparse":
        assert specs["encoder_self"].kernel == specs["decoder_self"].kernel == "sparse"
        assert specs["decoder_self"].options == specs["encoder_self"].options
        assert specs["encoder_self"].options["pattern"] == "sliding_window"
        assert specs["cross"].kernel == "eager" and not specs["cross"].options
    else:
        assert {spec.kernel for spec in specs.values()} == {option}
    torch.manual_seed(0)
    model = build_model(config["model"], config["attention"], src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    model.eval()
    src = torch.tensor([[5, 6, 7, 3], [8, 3, 0, 0]])
    tgt = torch.tensor([[2, 9, 10], [2, 11, 0]])
    with torch.no_grad():
        assert model(src, tgt).shape == (2, 3, 50)


def test_a_learned_feature_map_is_a_parameter_of_every_linear_layer(tmp_path: Path) -> None:
    config = compose_attention("linear", tmp_path, "attention.feature_map=favor", "attention.learned=true")
    model = build_model(config["model"], config["attention"], src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    learned = {name for name, _ in model.named_parameters() if name.endswith("kernel.weight")}
    layers = {name: module for name, module in model.named_modules() if isinstance(module, LinearAttention)}
    assert learned == {f"{name}.weight" for name in layers} and len(layers) >= 3
    assert {kernel.describe() for kernel in layers.values()} == {"linear favor m=64 learned"}


def test_sparse_config_override_reaches_both_self_attention_sites(tmp_path: Path) -> None:
    config = compose_attention("sparse", tmp_path, "attention.window=3", "attention.pattern=strided")
    specs = site_specs(config["attention"])
    assert specs["encoder_self"].options["window"] == specs["decoder_self"].options["window"] == 3
    assert specs["encoder_self"].options["pattern"] == specs["decoder_self"].options["pattern"] == "strided"
    assert specs["cross"].options == {}  # the eager cross-attention does not get the sparse options
    # One site differs: its options merge into the group's (Hydra's `+` adds a key the YAML leaves out).
    config = compose_attention("sparse", tmp_path, "+attention.sites.decoder_self.window=2")
    specs = site_specs(config["attention"])
    assert (specs["encoder_self"].options["window"], specs["decoder_self"].options["window"]) == (16, 2)
    assert specs["decoder_self"].options["block"] == specs["encoder_self"].options["block"]


@pytest.mark.parametrize(
    ("option", "override", "read_back", "expected"),
    [
        ("sparse", "attention.window=64", lambda kernel: kernel.settings.window, 64),
        ("linear", "attention.feature_map=favor", lambda kernel: kernel.feature_map, "favor"),
        ("flash", "attention.backend=math", lambda kernel: kernel.backend, "math"),
    ],
    ids=["sparse", "linear", "flash"],
)
def test_kernel_options_are_set_beside_the_kernel_on_the_command_line(
    option: str, override: str, read_back: Callable, expected: object, tmp_path: Path
) -> None:
    config = compose_attention(option, tmp_path, override)
    model = build_model(config["model"], config["attention"], src_vocab_size=50, tgt_vocab_size=50, pad_id=0)
    assert read_back(model.encoder[0].self_attn.kernel) == expected
    assert read_back(model.decoder[0].self_attn.kernel) == expected


def test_a_misspelt_kernel_option_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    config = compose_attention("sparse", tmp_path, "+attention.windw=3")
    message = (
        r"unknown key\(s\) \['windw'\] in attention; .* the options of kernel 'sparse': \['pattern', 'window'"
    )
    with pytest.raises(AttentionConfigError, match=message):
        site_specs(config["attention"])


def test_linear_config_with_attention_dropout_fails_when_the_model_is_built(tmp_path: Path) -> None:
    config = compose_attention("linear", tmp_path, "attention.dropout=0.1")
    with pytest.raises(AttentionConfigError, match=r"'linear' cannot apply attention dropout \(dropout=0.1"):
        build_model(config["model"], config["attention"], src_vocab_size=50, tgt_vocab_size=50, pad_id=0)


@pytest.mark.parametrize(
    "attention",
    [
        {"kernel": "sparse", "sites": {"cross": {"kernel": "eager"}}, "options": {}},
        {"kernel": "linear", "options": {"feature_map": "favor", "num_features": 16}},
        {"kernel": "flash", "options": {"backend": "math"}},
    ],
    ids=["sparse", "linear", "flash"],
)
def test_transformer_incremental_decoding_equals_teacher_forcing(make_transformer, attention: dict) -> None:
    if attention["kernel"] == "sparse":  # a window smaller than the target: the decoder cache is truncated
        attention = {
            **attention,
            "sites": {
                **attention["sites"],
                **{site: {"options": {"window": 2, "block": 4}} for site in ("encoder_self", "decoder_self")},
            },
        }
    model = make_transformer(attention=attention)
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(3, 40, (2, 9), generator=gen)
    src[1, 6:] = 0
    tgt_in = torch.randint(3, 40, (2, 8), generator=gen)
    with torch.no_grad():
        full = F.log_softmax(model(src, tgt_in), dim=-1)
        state = model.start_decoding(model.encode(src))
        steps = [model.decode_step(tgt_in[:, t], state) for t in range(tgt_in.size(1))]
    torch.testing.assert_close(torch.stack(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    if attention["kernel"] == "sparse":
        assert all(cache.self_attn.length() == 3 for cache in state.caches)


def test_new_kernels_are_registered() -> None:
    from app.attention import available_kernels

    assert {"sparse", "linear", "flash"} <= set(available_kernels())
    # `exact` keeps the softmax-equality tests of test_attention.py to kernels that compute full softmax.
    assert not build_kernel("sparse").capabilities.exact and not build_kernel("linear").capabilities.exact
    assert build_kernel("flash").capabilities.exact
    assert PATTERNS == ("sliding_window", "strided", "fixed", "global_window", "random_blocks")
