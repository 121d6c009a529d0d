"""The lsh kernel (Kitaev et al. 2020, "Reformer"): softmax attention with one bucket and chunks covering
everything, the softmax over the union of the rounds' buckets with several, the chunked form equal to the
direct one, no leaks from padding or (causal) from later positions, cached decoding equal to the full pass."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from app.attention import AttentionConfigError, MultiHeadAttention, build_kernel
from app.attention.base import repeat_kv
from app.attention.cache import CodedKVCache
from app.attention.config import AttentionSpec
from app.attention.factory import build_attention
from app.attention.kernels import lsh_shared
from app.attention.kernels.lsh import LSHAttention

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def inputs(
    *, heads: int = 4, kv_heads: int = 2, tq: int = 13, tk: int = 13, padded: bool = True, seed: int = 0
):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(3, heads, tq, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(3, kv_heads, tk, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(3, kv_heads, tk, 8, generator=gen, dtype=torch.float64)
    key_mask = torch.arange(tk)[None, :] < torch.tensor([tk, tk - 4, 2])[:, None] if padded else None
    return q, k, v, key_mask


def masked_softmax(q: Tensor, k: Tensor, v: Tensor, visible: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) v over ``visible`` (B|1, H|1, Tq, Tk) keys; rows without keys give 0."""
    k, v = repeat_kv(k, q.size(1)), repeat_kv(v, q.size(1))
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


def visible_keys(key_mask: Tensor | None, tq: int, tk: int, *, causal: bool) -> Tensor:
    """(B|1, 1, Tq, Tk) padding and causal visibility; queries are the last Tq positions."""
    qpos = torch.arange(tq)[:, None] + (tk - tq)
    visible = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        visible = torch.arange(tk)[None, :] <= qpos
    visible = visible[None, None]
    return visible if key_mask is None else visible & key_mask[:, None, None, :]


def self_rule(visible: Tensor, tq: int, tk: int) -> Tensor:
    """``visible`` without each query's own key, unless that key is all it may see (paper, section 2)."""
    own = torch.arange(tk)[None, :] == torch.arange(tq)[:, None] + (tk - tq)  # (Tq, Tk)
    others = visible & ~own
    return others | (visible & own & ~others.any(-1, keepdim=True))


SHAPES = {
    "self": {"tq": 13, "tk": 13},
    "step": {"tq": 1, "tk": 9},  # a decoding step against a cache
    "tq_lt_tk": {"tq": 4, "tk": 11},
    "mqa": {"tq": 13, "tk": 13, "kv_heads": 1},
    "mha": {"tq": 13, "tk": 13, "kv_heads": 4},
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_one_bucket_with_chunks_covering_everything_is_softmax_attention(
    shape: dict, causal: bool, exclude_self: bool
) -> None:
    q, k, v, key_mask = inputs(**shape)
    kernel = build_kernel("lsh", n_buckets=1, n_hashes=2, chunk_size=16, exclude_self=exclude_self)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v)]
    got = kernel(*ours, key_mask=key_mask, causal=causal).context
    visible = visible_keys(key_mask, q.size(2), k.size(2), causal=causal)
    if exclude_self:
        visible = self_rule(visible, q.size(2), k.size(2))
        expected = masked_softmax(*theirs, visible)
    else:
        expected = build_kernel("eager")(*theirs, key_mask=key_mask, causal=causal).context
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(expected)
    for a, b in zip(
        torch.autograd.grad(got, ours, grad), torch.autograd.grad(expected, theirs, grad), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_rounds_combine_into_the_softmax_over_the_union_of_their_buckets(causal: bool) -> None:
    q, k, v, key_mask = inputs(kv_heads=4)
    kernel = build_kernel("lsh", n_buckets=4, n_hashes=3, chunk_size=16, exclude_self=False, seed=5)
    got = kernel(q, k, v, key_mask=key_mask, causal=causal).context
    same = (kernel.buckets(q)[..., :, None] == kernel.buckets(k)[..., None, :]).any(0)  # (B, H, Tq, Tk)
    expected = masked_softmax(q, k, v, same & visible_keys(key_mask, 13, 13, causal=causal))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(got, build_kernel("eager")(q, k, v, key_mask=key_mask, causal=causal).context)


def both_forms(kernel: LSHAttention, q, k, v, key_mask, *, causal: bool):
    """Each round's log-sum-exp and context by the direct (dense) and the chunked computation."""
    k, v = repeat_kv(k, q.size(1)), repeat_kv(v, q.size(1))
    qb, kb = kernel.buckets(q), kernel.buckets(k)
    if key_mask is not None:
        kb = kb.masked_fill(~key_mask[None, :, None, :], kernel.n_buckets)
    q = q / math.sqrt(q.size(-1))
    dense = kernel._rounds_dense(q, k, v, qb, kb, causal=causal)
    z, outs = kernel._rounds_chunked(q, k, v, qb, kb, causal=causal)
    return dense, (z, torch.stack(outs))


SETTINGS = {
    "b2_c1": {"n_buckets": 2, "n_hashes": 2, "chunk_size": 1},
    "b4_c2": {"n_buckets": 4, "n_hashes": 3, "chunk_size": 2},
    "b8_c3_self": {"n_buckets": 8, "n_hashes": 2, "chunk_size": 3, "exclude_self": False},
    "b1_c2": {"n_buckets": 1, "n_hashes": 1, "chunk_size": 2},
}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("causal", [False, True])
def test_the_chunked_form_equals_the_direct_one(settings: dict, shape: dict, causal: bool) -> None:
    q, k, v, key_mask = inputs(**shape, seed=3)
    kernel = build_kernel("lsh", **settings)
    (z_dense, out_dense), (z_chunked, out_chunked) = both_forms(kernel, q, k, v, key_mask, causal=causal)
    finite = torch.isfinite(z_dense)
    assert torch.equal(finite, torch.isfinite(z_chunked))
    torch.testing.assert_close(z_chunked[finite], z_dense[finite], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_chunked, out_dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_chunked_gradients_equal_the_direct_ones(causal: bool) -> None:
    leaves = [t.requires_grad_() for t in inputs(seed=4)[:3]]
    key_mask = inputs(seed=4)[3]
    kernel = build_kernel("lsh", n_buckets=2, n_hashes=2, chunk_size=2)
    grads = []
    for z, out in both_forms(kernel, *leaves, key_mask, causal=causal):
        loss = out.square().sum() + z[torch.isfinite(z)].sum()
        grads.append(torch.autograd.grad(loss, leaves, retain_graph=True))
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_padding_never_leaks() -> None:
    q, k, v, key_mask = inputs()
    kernel = build_kernel("lsh", n_buckets=2, n_hashes=3, chunk_size=2)
    out = kernel(q, k, v, key_mask=key_mask).context
    hidden = ~key_mask[:, None, :, None]
    noise = torch.randn_like(k) * 100
    changed = kernel(
        q, torch.where(hidden, noise, k), torch.where(hidden, noise, v), key_mask=key_mask
    ).context
    real = key_mask[:, None, :, None].expand_as(out)  # outputs at real query positions
    torch.testing.assert_close(changed[real], out[real], rtol=0, atol=0)


def test_causal_outputs_do_not_depend_on_later_positions() -> None:
    # The chunked form's chunks depend on every item's bucket, yet what a query sees must not: its window
    # is chosen among earlier keys only, so that decoding step by step can reproduce it.
    q, k, v, _ = inputs(tq=16, tk=16, padded=False)
    kernel = build_kernel("lsh", n_buckets=2, n_hashes=2, chunk_size=2)
    out = kernel(q, k, v, causal=True).context
    cut = 9
    later = torch.randn(3, 4, 16 - cut, 8, dtype=torch.float64)
    q2 = torch.cat([q[:, :, :cut], later], dim=2)
    k2 = torch.cat([k[:, :, :cut], later[:, :2]], dim=2)
    v2 = torch.cat([v[:, :, :cut], -later[:, :2]], dim=2)
    changed = kernel(q2, k2, v2, causal=True).context
    torch.testing.assert_close(changed[:, :, :cut], out[:, :, :cut], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_cached_decoding_equals_full_recomputation(kv_heads: int) -> None:
    torch.manual_seed(0)
    kernel = build_kernel("lsh", n_buckets=2, n_hashes=2, chunk_size=2)
    layer = MultiHeadAttention(d_model=32, num_heads=4, num_kv_heads=kv_heads, kernel=kernel).double().eval()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    full, _ = layer(x, causal=True)  # 12 x 12 with chunks of 2: the chunked form
    cache = kernel.new_cache(cross=False)
    steps = [layer(x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(12)]  # the direct form
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    # Each key was hashed once, when it entered the cache: its buckets are kept beside it.
    assert cache.codes.shape == (2, kv_heads, 12, 2)
    assert torch.equal(cache.codes, kernel.key_codes(cache.k))


def test_a_cache_rebuilt_without_buckets_hashes_its_keys_again() -> None:
    # A decoding step given bare keys and values (as the compiled steps rebuild their caches) decodes the
    # same: the kernel hashes every cached key, and the cache keeps no buckets from then on.
    torch.manual_seed(0)
    kernel = build_kernel("lsh", n_buckets=2, n_hashes=2, chunk_size=2, shared_qk=True)
    layer = MultiHeadAttention(d_model=32, num_heads=4, num_kv_heads=2, kernel=kernel).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    cache = kernel.new_cache(cross=False)
    layer(x[:, :8], causal=True, cache=cache)
    bare = CodedKVCache(k=cache.k, v=cache.v)
    with_codes, _ = layer(x[:, 8:], causal=True, cache=cache)
    without, _ = layer(x[:, 8:], causal=True, cache=bare)
    torch.testing.assert_close(without, with_codes, rtol=0, atol=0)
    assert cache.codes.shape[2] == 9 and bare.codes is None


def test_rotations_are_seeded() -> None:
    q, k, v, key_mask = inputs()
    first, again = (build_kernel("lsh", n_buckets=4, chunk_size=2, seed=1) for _ in range(2))
    assert torch.equal(first.buckets(q), again.buckets(q))
    assert torch.equal(first(q, k, v, key_mask=key_mask).context, again(q, k, v, key_mask=key_mask).context)
    other = build_kernel("lsh", n_buckets=4, chunk_size=2, seed=2)
    assert not torch.equal(first.buckets(q), other.buckets(q))
    assert first.buckets(q).max() == 3 and first.buckets(q).shape == (4, 3, 4, 13)


def test_buckets_are_the_argmax_over_the_rotations_and_their_negatives() -> None:
    kernel = build_kernel("lsh", n_buckets=8, n_hashes=3, seed=4)
    x = torch.randn(2, 3, 50, 8)
    x[0, 0, 0] = 0.0  # every rotation 0: a tie, which argmax breaks towards the first half
    rotated = torch.einsum("bhtd,rdn->rbhtn", x, kernel.rotations(8, x.device))
    expected = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)  # the paper's h(x)
    assert torch.equal(kernel.buckets(x), expected) and kernel.buckets(x)[:, 0, 0, 0].tolist() == [0, 0, 0]


def test_cross_attention_weights_and_dropout_are_refused_with_the_reason() -> None:
    message = r"'lsh' cannot serve the cross site: it lacks across_sequences \(LSH buckets relate positions"
    with pytest.raises(AttentionConfigError, match=message):
        build_attention(AttentionSpec(kernel="lsh"), site="cross", d_model=32, num_heads=4)
    for site in ("encoder_self", "decoder_self"):
        assert isinstance(
            build_attention(AttentionSpec(kernel="lsh"), site=site, d_model=32, num_heads=4),
            MultiHeadAttention,
        )
    q, k, v, _ = inputs()
    with pytest.raises(ValueError, match="cannot return attention weights"):
        build_kernel("lsh")(q, k, v, need_weights=True)
    with pytest.raises(ValueError, match="cannot apply attention dropout"):
        build_kernel("lsh")(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"n_buckets": 3}, r"n_buckets=3 must be 1 or even"),
        ({"n_hashes": 0}, r"n_hashes=0 must be an integer >= 1"),
        ({"chunk_size": 1.5}, r"chunk_size=1.5 must be an integer >= 1"),
        ({"seed": "a"}, r"seed='a' must be an integer"),
    ],
)
def test_bad_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(AttentionConfigError, match=message):
        build_kernel("lsh", **options)


def saved_bytes_and_grads(kernel: LSHAttention, inputs: tuple, key_mask: Tensor, *, causal: bool):
    """Bytes autograd keeps for the backward pass (distinct storages), the output and input gradients."""
    saved: dict[int, int] = {}

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    leaves = [t.clone().requires_grad_() for t in inputs]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = kernel(*leaves, key_mask=key_mask, causal=causal).context
    grads = torch.autograd.grad(out.square().sum(), leaves)
    return sum(saved.values()), out.detach(), grads


def assert_recompute_matches(settings: dict, tensors: tuple, key_mask: Tensor, *, causal: bool) -> None:
    """``recompute=True`` gives the same output and gradients as storing, keeping under half the bytes."""
    stored = saved_bytes_and_grads(build_kernel("lsh", **settings), tensors, key_mask, causal=causal)
    recomputed = saved_bytes_and_grads(
        build_kernel("lsh", **settings, recompute=True), tensors, key_mask, causal=causal
    )
    torch.testing.assert_close(recomputed[1], stored[1], rtol=1e-12, atol=1e-12)
    for got, expected in zip(recomputed[2], stored[2], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert recomputed[0] < stored[0] / 2


@pytest.mark.parametrize("causal", [False, True])
def test_recompute_gives_the_same_result_and_gradients_with_less_saved(causal: bool) -> None:
    q, k, v, key_mask = inputs(tq=40, tk=40)
    settings = {"n_buckets": 4, "n_hashes": 3, "chunk_size": 4}
    assert_recompute_matches(settings, (q, k, v), key_mask, causal=causal)


# --- shared QK (the paper's form): keys are the unit-length queries, one sorted item per token ----------


def shared_inputs(*, length: int = 13, seed: int = 0):
    """Queries, values and padding of a self-attention call (4 heads, 3 rows of 13, 9 and 2 tokens)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 4, length, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(3, 4, length, 8, generator=gen, dtype=torch.float64)
    key_mask = torch.arange(length)[None, :] < torch.tensor([length, length - 4, 2])[:, None]
    return q, v, key_mask


def shared_forms(kernel: LSHAttention, q: Tensor, v: Tensor, key_mask: Tensor, *, causal: bool):
    """Each round's log-sum-exp and context by the direct form and the shared-QK chunked one."""
    k = kernel.shared_keys(q)
    kb = kernel.buckets(k).masked_fill(~key_mask[None, :, None, :], kernel.n_buckets)
    q = q / math.sqrt(q.size(-1))
    z, outs = kernel._rounds_shared(q, k, v, kb, kb, causal=causal)
    return kernel._rounds_dense(q, k, v, kb, kb, causal=causal), (z, torch.stack(outs))


SHARED_SETTINGS = {**SETTINGS, "b4_c5": {"n_buckets": 4, "n_hashes": 2, "chunk_size": 5}}


@pytest.mark.parametrize("settings", SHARED_SETTINGS.values(), ids=SHARED_SETTINGS.keys())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", ["one_block", "chunk_blocks"])
def test_the_shared_qk_chunked_form_equals_the_direct_one(
    settings: dict, causal: bool, block: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block == "chunk_blocks":  # every sorted chunk a block of its own
        monkeypatch.setattr(lsh_shared, "BLOCK_SCORES", 1)
    kernel = build_kernel("lsh", **settings, shared_qk=True)
    leaves = [t.requires_grad_() for t in shared_inputs(seed=3)[:2]]
    key_mask = shared_inputs(seed=3)[2]
    (z_dense, out_dense), (z_shared, out_shared) = shared_forms(kernel, *leaves, key_mask, causal=causal)
    finite = torch.isfinite(z_dense)
    assert torch.equal(finite, torch.isfinite(z_shared))
    torch.testing.assert_close(z_shared[finite], z_dense[finite], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out_shared, out_dense, rtol=1e-12, atol=1e-12)
    grads = [
        torch.autograd.grad(out.square().sum() + z[torch.isfinite(z)].sum(), leaves, retain_graph=True)
        for z, out in ((z_dense, out_dense), (z_shared, out_shared))
    ]
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_shared_qk_with_one_bucket_is_softmax_attention_over_unit_queries(causal: bool) -> None:
    q, v, key_mask = shared_inputs(length=20)
    kernel = build_kernel("lsh", n_buckets=1, n_hashes=2, chunk_size=32, exclude_self=False, shared_qk=True)
    got = kernel(q, kernel.shared_keys(q), v, key_mask=key_mask, causal=causal).context
    unit = q / q.norm(dim=-1, keepdim=True)
    expected = masked_softmax(q, unit, v, visible_keys(key_mask, 20, 20, causal=causal))
    real = key_mask[:, None, :, None].expand_as(got)  # padded tokens keep to padded keys: not compared
    torch.testing.assert_close(got[real], expected[real], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_a_shared_qk_layer_has_no_key_projection_and_decodes_as_the_full_pass(kv_heads: int) -> None:
    torch.manual_seed(0)
    kernel = build_kernel("lsh", n_buckets=2, n_hashes=2, chunk_size=2, shared_qk=True)
    layer = MultiHeadAttention(d_model=32, num_heads=4, num_kv_heads=kv_heads, kernel=kernel).double().eval()
    assert layer.k_proj is None and "k_proj.weight" not in layer.state_dict()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    full, _ = layer(x, causal=True)  # 12 x 12 with chunks of 2: the shared chunked form
    cache = kernel.new_cache(cross=False)
    steps = [layer(x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(12)]  # the direct form
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    # Keys of every query head with their buckets in each round, values of the kv heads: what
    # cache_bytes counts per sentence (float32 keys and values, int16 buckets).
    assert cache.codes.shape == (2, 4, 12, 2) and cache.codes.dtype == torch.int16
    held = ((cache.k.numel() + cache.v.numel()) * 4 + cache.codes.numel() * 2) // 2
    assert held == kernel.cache_bytes(12, num_kv_heads=kv_heads, head_dim=8, dtype=torch.float32)


def test_shared_qk_padding_never_leaks_and_recompute_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lsh_shared, "BLOCK_SCORES", 3 * 4 * 4 * 4 * 3 * 3)  # 3 sorted chunks per block
    q, v, key_mask = shared_inputs(length=40)
    settings = {"n_buckets": 4, "n_hashes": 3, "chunk_size": 4, "shared_qk": True}
    kernel = build_kernel("lsh", **settings)
    k = kernel.shared_keys(q)
    out = kernel(q, k, v, key_mask=key_mask).context
    hidden = ~key_mask[:, None, :, None]
    noise = torch.randn_like(q) * 100
    changed = kernel(torch.where(hidden, noise, q), k, torch.where(hidden, noise, v), key_mask=key_mask)
    real = key_mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(changed.context[real], out[real], rtol=0, atol=0)
    for causal in (False, True):
        assert_recompute_matches(settings, (q, k, v), key_mask, causal=causal)
