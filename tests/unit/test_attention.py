"""Tests for the attention kernels, their registry and factory, and MultiHeadAttention head layouts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from app.attention import (
    AttentionConfigError,
    AttentionKernel,
    AttentionOutput,
    KernelCapabilities,
    MultiHeadAttention,
    available_kernels,
    build_kernel,
    register_kernel,
)
from app.attention import registry as registry_module
from app.attention.cache import RecurrentCache, WindowCache
from app.attention.config import SITES, AttentionSpec, site_specs
from app.attention.factory import build_attention
from app.attention.kernels.eager import EagerAttention
from app.attention.registry import kernel_class

pytestmark = pytest.mark.usefixtures("single_torch_thread")

KERNELS = available_kernels()
# Kernels that compute full softmax attention; approximations and sparse patterns have their own
# reference tests in test_attention_variants.py.
EXACT_KERNELS = [name for name in KERNELS if kernel_class(name).capabilities.exact]
# Kernels that can mask causally (linformer cannot: its projection mixes every position).
CAUSAL_KERNELS = [name for name in KERNELS if kernel_class(name).capabilities.causal]


def test_builtin_kernels_are_registered() -> None:
    assert {"eager", "sdpa"} <= set(KERNELS)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool) -> Tensor:
    """softmax(q k^T / sqrt(d)) v, one (batch, head, query) row at a time, over the visible keys only.

    Query head h uses kv head h // (H / Hkv); a row without visible keys is all zeros.
    """
    batch, heads, tq, dim = q.shape
    kv_heads, tk = k.size(1), k.size(2)
    group = heads // kv_heads
    rows = []
    for b in range(batch):
        for h in range(heads):
            kh = h // group
            for i in range(tq):
                visible = [
                    j
                    for j in range(tk)
                    if (key_mask is None or bool(key_mask[b, j])) and (not causal or j <= i + tk - tq)
                ]
                if not visible:
                    rows.append(q.new_zeros(v.size(-1)) + 0.0 * q[b, h, i].sum())
                    continue
                keys, values = k[b, kh, visible], v[b, kh, visible]
                weights = torch.softmax(keys @ q[b, h, i] / math.sqrt(dim), dim=0)
                rows.append(weights @ values)
    return torch.stack(rows).view(batch, heads, tq, v.size(-1))


@dataclass(frozen=True)
class Case:
    heads: int = 4
    kv_heads: int = 4
    tq: int = 5
    tk: int = 5
    padded: bool = False  # lengths Tk, Tk - 2, 2 (0 with ``empty``): right padding, left with ``left``
    causal: bool = False
    left: bool = False
    empty: bool = False


CASES = {
    "plain": Case(),
    "key_padding": Case(tq=4, tk=6, padded=True),
    "causal": Case(causal=True),
    "causal_padded": Case(padded=True, causal=True),
    "causal_tq_lt_tk": Case(tq=3, tk=7, causal=True),
    "incremental_step": Case(tq=1, tk=6, causal=True, padded=True),
    "incremental_step_gqa": Case(kv_heads=2, tq=1, tk=6, causal=True),
    "cross_step": Case(tq=1, tk=6, padded=True),  # a decoding step's cross-attention
    "gqa_2_of_4": Case(kv_heads=2, tq=4, tk=6, padded=True, causal=True),
    "mqa_1_of_4": Case(kv_heads=1, tq=4, tk=6, padded=True),
    "mqa_causal": Case(kv_heads=1, causal=True),
    # causal queries before their sequence's first real key see nothing (rows of a row-dependent mask)
    "causal_left_padded_gqa": Case(kv_heads=2, padded=True, left=True, causal=True),
    "no_keys_gqa": Case(kv_heads=2, tq=4, tk=6, padded=True, empty=True),  # a sequence without keys
    "no_keys_causal_tq_lt_tk": Case(kv_heads=1, tq=3, tk=6, padded=True, left=True, empty=True, causal=True),
}


def random_inputs(case: Case, dtype: torch.dtype = torch.float64, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    batch, dim = 3, 8
    q = torch.randn(batch, case.heads, case.tq, dim, generator=gen, dtype=dtype)
    k = torch.randn(batch, case.kv_heads, case.tk, dim, generator=gen, dtype=dtype)
    v = torch.randn(batch, case.kv_heads, case.tk, dim, generator=gen, dtype=dtype)
    key_mask = None
    if case.padded:
        lengths = torch.tensor([case.tk, case.tk - 2, 0 if case.empty else 2])
        positions = torch.arange(case.tk).flip(0) if case.left else torch.arange(case.tk)
        key_mask = positions[None, :] < lengths[:, None]
    return q, k, v, key_mask


@pytest.mark.parametrize("name", EXACT_KERNELS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_kernel_matches_reference_forward_and_gradients(name: str, case: Case) -> None:
    kernel = build_kernel(name)
    q, k, v, key_mask = random_inputs(case)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]

    out = kernel(*inputs, key_mask=key_mask, causal=case.causal)
    expected = reference_attention(*ref_inputs, key_mask, case.causal)
    torch.testing.assert_close(out.context, expected, rtol=1e-9, atol=1e-10)

    grad_out = torch.randn_like(expected)
    grads = torch.autograd.grad(out.context, inputs, grad_out)
    ref_grads = torch.autograd.grad(expected, ref_inputs, grad_out)
    for got, want, label in zip(grads, ref_grads, "qkv", strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=lambda m, n=label: f"d{n}: {m}")


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_single_queries_of_many_rows_match_reference(kv_heads: int) -> None:
    """Above 256 (row, head) pairs a single-query step takes sdpa's explicit CPU path: the same function."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(80, 4, 1, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(80, kv_heads, 6, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    key_mask = torch.arange(6)[None, :] < torch.randint(1, 7, (80,), generator=gen)[:, None]
    for mask, causal in ((key_mask, False), (None, True)):
        out = build_kernel("sdpa")(q, k, v, key_mask=mask, causal=causal).context
        torch.testing.assert_close(out, reference_attention(q, k, v, mask, causal), rtol=1e-9, atol=1e-10)


def test_sdpa_single_queries_export_for_any_row_count() -> None:
    """A program exported with the row count symbolic (an ahead-of-time package of several sentences) takes
    one path for every count instead of constraining the count to one side of the 256 pairs."""

    class Step(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = build_kernel("sdpa")

        def forward(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor) -> Tensor:
            return self.kernel(q, k, v, key_mask=key_mask).context

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(8, 4, 1, 8, generator=gen)
    k, v = (torch.randn(8, 2, 6, 8, generator=gen) for _ in range(2))
    key_mask = torch.arange(6)[None, :] < torch.randint(1, 7, (8,), generator=gen)[:, None]
    rows = {0: torch.export.Dim("rows", min=2, max=4096)}
    program = torch.export.export(Step(), (q, k, v, key_mask), dynamic_shapes=(rows,) * 4, strict=False)
    for count in (8, 100):  # 32 and 400 (row, head) pairs
        args = [t.repeat(count // 8 + 1, *[1] * (t.dim() - 1))[:count] for t in (q, k, v, key_mask)]
        torch.testing.assert_close(program.module()(*args), reference_attention(*args, False))


class RecordSDPAMasks(TorchFunctionMode):
    """Records the ``attn_mask`` and ``is_causal`` of every scaled_dot_product_attention call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Tensor | None, bool]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal", False)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", ["sdpa", "flash"])
@pytest.mark.parametrize(
    ("case", "shape", "is_causal"),
    [
        ("plain", None, False),
        ("causal", None, True),  # no mask: is_causal
        ("key_padding", (3, 1, 1, 6), False),  # key padding alone: broadcast over the queries
        ("no_keys_gqa", (3, 1, 1, 6), False),
        ("causal_tq_lt_tk", (1, 1, 3, 7), False),  # causal alone, bottom-right: one mask for the batch
        ("causal_padded", (3, 1, 5, 5), False),  # both: the only case with a per-sequence (Tq, Tk) mask
    ],
)
def test_fused_kernels_pass_no_mask_or_the_smallest_float_mask(
    name: str, case: str, shape: tuple | None, is_causal: bool
) -> None:
    q, k, v, key_mask = random_inputs(CASES[case], dtype=torch.float32)
    with RecordSDPAMasks() as recorder:
        build_kernel(name)(q, k, v, key_mask=key_mask, causal=CASES[case].causal)
    [(mask, causal)] = recorder.calls
    assert causal == is_causal
    assert (mask is None) == (shape is None)
    if mask is not None:
        assert mask.dtype == torch.float32 and tuple(mask.shape) == shape
        assert (
            torch.isfinite(mask).any(dim=-1).all()
        )  # every row sees a key: no backend meets an all -inf row


class RecordOps(TorchDispatchMode):
    """Records the names of the aten operators a call runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("dtype", "length", "flash"),
    [(torch.bfloat16, 16, False), (torch.bfloat16, 200, True), (torch.float32, 16, True)],
)
def test_sdpa_on_a_cpu_takes_math_for_short_bfloat16_calls(
    dtype: torch.dtype, length: int, flash: bool
) -> None:
    """PyTorch's CPU flash kernel is slower than math in bfloat16 up to ~128 keys (CPU_BF16_MATH_UP_TO)."""
    q = torch.randn(2, 4, length, 8, dtype=dtype)
    key_mask = torch.arange(length)[None, :] < torch.tensor([[length], [length // 2]])
    for mask in (key_mask, None):
        with RecordOps() as recorder:
            out = build_kernel("sdpa")(q, q, q, key_mask=mask).context
        assert ("aten._scaled_dot_product_flash_attention_for_cpu" in recorder.ops) == flash
        expected = build_kernel("eager")(q.double(), q.double(), q.double(), key_mask=mask).context
        torch.testing.assert_close(out.double(), expected, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_contract(name: str) -> None:
    kernel = build_kernel(name)
    assert isinstance(kernel, AttentionKernel)
    q, k, v, key_mask = random_inputs(CASES["gqa_2_of_4"], dtype=torch.float32)
    v = torch.randn(*v.shape[:-1], 6)  # the value width may differ from the query/key width
    out = kernel(q, k, v, key_mask=key_mask, causal=kernel.capabilities.causal)
    assert isinstance(out, AttentionOutput)
    assert out.context.shape == (3, 4, 4, 6)
    assert out.context.dtype == torch.float32
    assert out.weights is None  # not asked for


@pytest.mark.parametrize("name", EXACT_KERNELS)
def test_kernel_weights_when_supported(name: str) -> None:
    kernel = build_kernel(name)
    case = CASES["causal_padded"]
    q, k, v, key_mask = random_inputs(case)
    if not kernel.capabilities.returns_weights:
        with pytest.raises(ValueError, match="weights"):
            kernel(q, k, v, key_mask=key_mask, causal=True, need_weights=True)
        return
    out = kernel(q, k, v, key_mask=key_mask, causal=True, need_weights=True)
    assert out.weights.shape == (3, 4, case.tq, case.tk)
    # The weights reproduce the context, sum to one per row and vanish on hidden keys.
    torch.testing.assert_close(out.weights @ v, out.context)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, 4, case.tq, dtype=torch.float64))
    hidden = ~(key_mask[:, None, None, :] & torch.ones(case.tq, case.tk, dtype=torch.bool).tril())
    assert torch.all(out.weights.masked_select(hidden.expand_as(out.weights)) == 0)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_without_keys_are_zero_with_finite_gradients(name: str, dtype: torch.dtype) -> None:
    kernel = build_kernel(name)
    q, k, v, _ = random_inputs(Case(kv_heads=2, tq=3, tk=5), dtype=dtype)
    key_mask = torch.tensor([[True] * 5, [False] * 5, [True, False, False, False, False]])
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    for causal in (False, True) if kernel.capabilities.causal else (False,):
        out = kernel(*inputs, key_mask=key_mask, causal=causal)
        assert torch.isfinite(out.context).all()
        assert torch.all(out.context[1] == 0)
        assert out.context[0].abs().sum() > 0 and out.context[2].abs().sum() > 0
        grads = torch.autograd.grad(out.context.sum(), inputs)
        for grad in grads:
            assert torch.isfinite(grad).all()
        assert torch.all(grads[0][1] == 0)  # nothing flows into queries that attend nothing


@pytest.mark.parametrize("name", CAUSAL_KERNELS)
def test_causal_queries_before_the_first_key_are_zero(name: str) -> None:
    # Tq > Tk: query i sits at position i - 2, so the first two queries see no key at all.
    q, k, v, _ = random_inputs(Case(tq=5, tk=3), dtype=torch.float32)
    out = build_kernel(name)(q, k, v, causal=True)
    assert torch.isfinite(out.context).all()
    assert torch.all(out.context[:, :, :2] == 0)
    assert torch.all(out.context[:, :, 2:].abs().sum(-1) > 0)


@pytest.mark.parametrize("name", [n for n in EXACT_KERNELS if n != "eager"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_kernel_equals_eager_in_float32(name: str, case: Case) -> None:
    q, k, v, key_mask = random_inputs(case, dtype=torch.float32, seed=1)
    expected = build_kernel("eager")(q, k, v, key_mask=key_mask, causal=case.causal).context
    got = build_kernel(name)(q, k, v, key_mask=key_mask, causal=case.causal).context
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# --- MultiHeadAttention: head layouts ------------------------------------------------------------------


def make_mha(kernel: str = "eager", *, d_model: int = 32, heads: int = 4, kv_heads: int | None = None):
    return MultiHeadAttention(
        d_model=d_model, num_heads=heads, num_kv_heads=kv_heads, kernel=build_kernel(kernel)
    ).eval()


@pytest.mark.parametrize("name", EXACT_KERNELS)
@pytest.mark.parametrize("causal", [False, True])
def test_mha_equals_torch_multihead_attention(name: str, causal: bool) -> None:
    torch.manual_seed(0)
    ours = make_mha(name)
    theirs = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(2, 6, 32)
    key_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    attn_mask = torch.ones(6, 6, dtype=torch.bool).triu(1) if causal else None
    got, _ = ours(x, key_mask=key_mask, causal=causal)
    expected, _ = theirs(x, x, x, key_padding_mask=~key_mask, attn_mask=attn_mask, need_weights=False)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", KERNELS)
def test_kv_heads_equal_to_heads_is_plain_mha(name: str) -> None:
    torch.manual_seed(0)
    mha, explicit = make_mha(name), make_mha(name, kv_heads=4)
    explicit.load_state_dict(mha.state_dict())
    assert explicit.k_proj.out_features == 32
    x = torch.randn(2, 5, 32)
    causal = mha.kernel.capabilities.causal
    assert torch.equal(explicit(x, causal=causal)[0], mha(x, causal=causal)[0])


def expand_kv_projection(layer: nn.Linear, kv_heads: int, heads: int, head_dim: int) -> tuple[Tensor, Tensor]:
    """Weights of an MHA projection whose query head h uses the shared projection of kv head h // group."""
    group = heads // kv_heads
    weight = layer.weight.view(kv_heads, head_dim, -1).repeat_interleave(group, dim=0)
    bias = layer.bias.view(kv_heads, head_dim).repeat_interleave(group, dim=0)
    return weight.reshape(heads * head_dim, -1), bias.reshape(-1)


@pytest.mark.parametrize("name", EXACT_KERNELS)
@pytest.mark.parametrize("kv_heads", [1, 2], ids=["mqa", "gqa"])
def test_grouped_heads_equal_mha_with_shared_kv_projections(name: str, kv_heads: int) -> None:
    torch.manual_seed(0)
    grouped = make_mha(name, kv_heads=kv_heads)
    mha = make_mha(name)
    with torch.no_grad():
        for proj in ("q_proj", "out_proj"):
            getattr(mha, proj).load_state_dict(getattr(grouped, proj).state_dict())
        for proj in ("k_proj", "v_proj"):
            weight, bias = expand_kv_projection(getattr(grouped, proj), kv_heads, 4, 8)
            getattr(mha, proj).weight.copy_(weight)
            getattr(mha, proj).bias.copy_(bias)
    assert grouped.k_proj.weight.shape == (kv_heads * 8, 32)
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    memory_mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4])
    torch.testing.assert_close(grouped(x, causal=True)[0], mha(x, causal=True)[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        grouped(x, memory=memory, key_mask=memory_mask)[0],
        mha(x, memory=memory, key_mask=memory_mask)[0],
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize(("d_model", "heads"), [(30, 4), (32, 0), (32, 3)])
def test_heads_must_divide_width(d_model: int, heads: int) -> None:
    with pytest.raises(AttentionConfigError, match=rf"num_heads={heads} .*d_model={d_model}"):
        make_mha(d_model=d_model, heads=heads)


@pytest.mark.parametrize("kv_heads", [3, 0, 8])
def test_kv_heads_must_divide_heads(kv_heads: int) -> None:
    with pytest.raises(AttentionConfigError, match=rf"num_kv_heads={kv_heads} must divide num_heads=4"):
        make_mha(heads=4, kv_heads=kv_heads)


@pytest.mark.parametrize("name", KERNELS)
def test_gqa_cache_stores_only_kv_heads(name: str) -> None:
    torch.manual_seed(0)
    layer = make_mha(name, kv_heads=2)
    caps = layer.kernel.capabilities
    x = torch.randn(3, 4, 32)
    if caps.causal:  # decoder self-attention: a growing cache (linformer cannot serve that site)
        full, _ = layer(x, causal=True)
        cache = layer.kernel.new_cache(cross=False)
        steps = [layer(x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(4)]
        if caps.recurrent:  # a fixed-size state per kv head instead of keys and values
            assert isinstance(cache, RecurrentCache) and cache.state.kv.shape[:2] == (3, 2)
        else:
            assert cache.k.shape == cache.v.shape == (3, 2, 4, 8)
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    if not caps.across_sequences:
        return
    memory, mask = torch.randn(3, 6, 32), torch.tensor([[True] * 6, [True] * 2 + [False] * 4, [True] * 6])
    cross = layer.kernel.new_cache(cross=True)
    first, _ = layer(x[:, :1], memory=memory, key_mask=mask, cache=cross)
    # Kernels that reduce keys along the sequence cache the reduced form, once per sentence: linformer's
    # k projected rows, linear attention's sums over the source (feature width m = 8 rows for elu).
    rows = {"linformer": getattr(layer.kernel, "k", None), "linear": 8}.get(name, 6)
    assert cross.k.shape == (3, 2, rows, 8) and caps.reduces_keys == (rows != 6)
    # A static cache is reused: the memory passed on later steps is ignored.
    again, _ = layer(x[:, :1], memory=torch.zeros_like(memory), key_mask=mask, cache=cross)
    assert torch.equal(first, again)
    assert cross.k.shape == (3, 2, rows, 8)
    torch.testing.assert_close(first, layer(x[:, :1], memory=memory, key_mask=mask)[0])


def test_kv_cache_window_and_reorder() -> None:
    cache = WindowCache(max_len=3)
    for step in range(5):
        value = torch.full((2, 1, 1, 4), float(step))
        cache.append(value, value + 10)
    assert cache.length() == 3
    assert cache.k[0, 0, :, 0].tolist() == [2.0, 3.0, 4.0]
    cache.k[1] += 100
    cache.reorder(torch.tensor([1, 1, 0]))
    assert cache.k.shape[0] == 3
    assert cache.k[:, 0, 0, 0].tolist() == [102.0, 102.0, 2.0]
    assert cache.v[:, 0, 0, 0].tolist() == [12.0, 12.0, 12.0]


# --- registry and factory --------------------------------------------------------------------------------


def test_unknown_kernel_lists_valid_choices() -> None:
    with pytest.raises(AttentionConfigError, match="unknown attention kernel 'flash9'") as err:
        build_kernel("flash9")
    assert f"valid choices: {', '.join(KERNELS)}" in str(err.value)
    with pytest.raises(AttentionConfigError, match=r"valid choices: .*eager"):
        build_attention(AttentionSpec(kernel="flash9"), site="cross", d_model=32, num_heads=4)


def test_unknown_kernel_option_is_reported() -> None:
    with pytest.raises(AttentionConfigError, match=r"'eager' rejected options \{'window': 3\}"):
        build_kernel("eager", window=3)


def test_site_specs_defaults_and_overrides() -> None:
    specs = site_specs(
        {
            "name": "sparse",
            "kernel": "sparse",
            "num_kv_heads": 2,
            "dropout": 0.1,
            "window": 4,
            "sites": {
                "cross": {"kernel": "sdpa"},
                "decoder_self": {"num_kv_heads": 1, "block": 8},
                "encoder_self": None,
            },
        }
    )
    assert set(specs) == set(SITES)
    common = {"num_kv_heads": 2, "dropout": 0.1, "options": {"window": 4}}
    assert specs["encoder_self"] == AttentionSpec(kernel="sparse", **common)
    # Another kernel: the group's options are sparse's, so the site starts from its own (none here).
    assert specs["cross"] == AttentionSpec(kernel="sdpa", num_kv_heads=2, dropout=0.1, options={})
    assert specs["decoder_self"] == AttentionSpec(
        kernel="sparse", num_kv_heads=1, dropout=0.1, options={"window": 4, "block": 8}
    )
    assert site_specs({}) == dict.fromkeys(SITES, AttentionSpec())


def test_nested_options_of_older_configs_are_still_read() -> None:
    specs = site_specs(
        {"kernel": "linear", "options": {"feature_map": "favor"}, "sites": {"cross": {"eps": 0.1}}}
    )
    assert specs["encoder_self"].options == {"feature_map": "favor"}
    assert specs["cross"].options == {"feature_map": "favor", "eps": 0.1}


def test_site_override_changing_kernel_does_not_inherit_the_groups_options() -> None:
    group = {"kernel": "sparse", "options": {"window": 3, "block": 4}}
    specs = site_specs(
        {**group, "sites": {"cross": {"kernel": "eager"}, "decoder_self": {"kernel": "sparse"}}}
    )
    assert specs["cross"].options == {}
    assert specs["decoder_self"].options == specs["encoder_self"].options == {"window": 3, "block": 4}
    # Options given with the new kernel are its own; with the same kernel they merge into the group's.
    specs = site_specs(
        {
            **group,
            "sites": {
                "cross": {"kernel": "linear", "options": {"feature_map": "favor"}},
                "decoder_self": {"options": {"window": 5}},
            },
        }
    )
    assert specs["cross"].options == {"feature_map": "favor"}
    assert specs["decoder_self"].options == {"window": 5, "block": 4}
    for site, spec in specs.items():  # each kernel accepts what it got
        assert isinstance(build_attention(spec, site=site, d_model=32, num_heads=4), MultiHeadAttention)


@pytest.mark.parametrize("name", KERNELS)
def test_attention_dropout_is_rejected_at_build_time_only_where_impossible(name: str) -> None:
    spec = AttentionSpec(kernel=name, dropout=0.1)
    if kernel_class(name).capabilities.attention_dropout:  # sdpa and flash drop inside the fused kernel
        layer = build_attention(spec, site="encoder_self", d_model=32, num_heads=4)
        assert layer.dropout == 0.1
        return
    able = ", ".join(n for n in KERNELS if kernel_class(n).capabilities.attention_dropout)
    site = "cross" if kernel_class(name).capabilities.across_sequences else "encoder_self"
    message = (
        rf"kernel '{name}' cannot apply attention dropout \(dropout=0.1 at the {site} site\): set "
        rf"attention.dropout=0 \(attention.sites.{site}.dropout=0 for this site only\) .*{able}$"
    )
    with pytest.raises(AttentionConfigError, match=message):
        build_attention(spec, site=site, d_model=32, num_heads=4)
    build_attention(AttentionSpec(kernel=name), site=site, d_model=32, num_heads=4)  # dropout 0 is fine


def test_only_linear_lsh_and_flex_lack_attention_dropout_and_only_linear_is_recurrent() -> None:
    without = {n for n in KERNELS if not kernel_class(n).capabilities.attention_dropout}
    recurrent = {n for n in KERNELS if kernel_class(n).capabilities.recurrent}
    assert without == {"linear", "lsh", "flex"}  # flex: FlexAttention has no attention dropout
    assert recurrent == {"linear"}


def test_site_specs_unknown_key_is_named_with_its_place() -> None:
    with pytest.raises(AttentionConfigError, match=r"unknown key\(s\) \['kernal'\] in attention; valid keys"):
        site_specs({"kernal": "eager"})
    with pytest.raises(AttentionConfigError, match=r"\['heads'\] in attention\.sites\.cross; valid keys: .*"):
        site_specs({"sites": {"cross": {"heads": 2}}})


def test_site_specs_unknown_site_lists_valid_sites() -> None:
    with pytest.raises(AttentionConfigError, match=r"unknown attention site\(s\) \['decoder_cross'\]") as err:
        site_specs({"sites": {"decoder_cross": {}}})
    assert str(err.value).endswith("valid sites: encoder_self, decoder_self, cross")


@pytest.fixture
def kernel_lacking(monkeypatch: pytest.MonkeyPatch):
    """Register, for one test only, an eager-like kernel that lacks the named capability."""
    monkeypatch.setattr(registry_module, "_KERNELS", dict(registry_module._KERNELS))

    def register(capability: str) -> str:
        name = f"test-without-{capability}"

        @register_kernel(name)
        class Limited(EagerAttention):
            capabilities = KernelCapabilities(**{capability: False})

        return name

    return register


@pytest.mark.parametrize(
    ("capability", "rejecting_sites"),
    [
        ("causal", {"decoder_self"}),
        ("padding_mask", {"encoder_self", "cross"}),
        ("incremental", {"decoder_self", "cross"}),
    ],
)
def test_kernel_lacking_a_capability_is_rejected_for_sites_needing_it(
    kernel_lacking, capability: str, rejecting_sites: set[str]
) -> None:
    name = kernel_lacking(capability)
    assert name in available_kernels()
    for site in SITES:
        spec = AttentionSpec(kernel=name)
        if site in rejecting_sites:
            expected = rf"{name}' cannot serve the {site} site: it lacks .*{capability}"
            with pytest.raises(AttentionConfigError, match=expected):
                build_attention(spec, site=site, d_model=32, num_heads=4)
        else:
            assert isinstance(build_attention(spec, site=site, d_model=32, num_heads=4), MultiHeadAttention)


def test_registering_a_name_twice_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "_KERNELS", dict(registry_module._KERNELS))
    with pytest.raises(ValueError, match="'eager' is registered twice"):
        register_kernel("eager")(AttentionKernel)
