"""A growing KV cache holds a beam reorder back and gathers the kept rows into the next append.

The reference for every case is the plain cache: ``index_select`` on reorder, then ``torch.cat``. The
other kinds of cache (a sliding window's, cross-attention's) reorder at once.
"""

from __future__ import annotations

import torch

from app.attention import KVCache, MultiHeadAttention, build_kernel
from app.attention.cache import StaticCache, WindowCache


def step(rows: int, t: int = 1, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, t, 4, generator=gen), torch.randn(rows, 2, t, 4, generator=gen)


def test_reorders_then_appends_equal_selection_then_concatenation() -> None:
    cache, k_ref, v_ref = KVCache(), None, None
    index_gen = torch.Generator().manual_seed(1)
    rows = 6
    for n in range(12):
        k, v = step(rows, t=3 if n == 0 else 1, seed=n)  # a prompt of 3 positions, then one per step
        k_out, v_out = cache.append(k, v)
        k_ref = k if k_ref is None else torch.cat([k_ref, k], dim=2)
        v_ref = v if v_ref is None else torch.cat([v_ref, v], dim=2)
        assert torch.equal(k_out, k_ref) and torch.equal(v_out, v_ref)
        for _ in range(1 + n % 2):  # beam search: rows repeat and move; sometimes a sentence leaves
            rows = rows - 1 if n == 8 else rows
            index = torch.randint(0, k_ref.size(0), (rows,), generator=index_gen)
            cache.reorder(index)
            k_ref, v_ref = k_ref.index_select(0, index), v_ref.index_select(0, index)
    assert cache.pending is not None and cache.length() == 14
    assert torch.equal(cache.k, k_ref) and torch.equal(cache.v, v_ref)  # reading applies the reorder
    assert cache.pending is None


def test_a_reorder_is_gathered_into_the_append_not_copied_twice() -> None:
    cache = KVCache()
    cache.append(*step(4, t=5, seed=0))
    cache.reorder(torch.tensor([3, 3, 0, 1]))
    before = cache._k  # the held tensor: no copy has been made yet
    assert cache.pending is not None and cache._k is before
    k, _ = cache.append(*step(4, seed=1))
    assert cache.pending is None and k.is_contiguous() and k.shape == (4, 2, 6, 4)
    assert torch.equal(k[:, :, :5], before[[3, 3, 0, 1]])


def test_tensors_set_from_outside_replace_the_held_rows() -> None:
    """The compiled step reads ``k``/``v`` (reorder applied) and stores its own with ``replace``."""
    cache = KVCache()
    k0, v0 = step(2, t=3, seed=0)
    cache.append(k0, v0)
    cache.reorder(torch.tensor([1, 0]))
    assert torch.equal(cache.k, k0[[1, 0]]) and torch.equal(cache.v, v0[[1, 0]])
    cache.reorder(torch.tensor([1, 1]))
    replacement = step(2, t=4, seed=1)
    cache.replace(*replacement)
    assert cache.pending is None and cache.k is replacement[0] and cache.v is replacement[1]


def test_gradients_flow_through_a_cache_that_reorders() -> None:
    keys = torch.randn(2, 2, 5, 4, requires_grad=True)
    cache = KVCache()
    for t in range(5):
        cache.append(keys[:, :, t : t + 1], keys[:, :, t : t + 1] * 2)
        cache.reorder(torch.tensor([0, 0]))
        assert cache.pending is None  # applied at once: no held-back copies on the autograd tape
    (cache.k.sum() + cache.v.sum()).backward()
    assert keys.grad[0].sum() > 0 and torch.equal(keys.grad[1], torch.zeros_like(keys.grad[1]))


def test_static_and_windowed_caches_reorder_at_once() -> None:
    window = WindowCache(max_len=3)
    for n in range(6):
        window.append(*step(2, seed=n))
    window.reorder(torch.tensor([1, 0]))
    keys = torch.randn(2, 2, 4, 4)
    static = StaticCache(k=keys, v=keys.clone())
    static.reorder(torch.tensor([1, 0]))
    assert window.pending is None and window.length() == 3 and torch.equal(static.k, keys[[1, 0]])


def test_a_cross_attention_cache_shared_by_beams_selects_sentences() -> None:
    keys = torch.randn(2, 2, 4, 4)  # one row per sentence, shared by its 3 beams
    shared = StaticCache(shared=True, k=keys, v=keys.clone())
    shared.reorder(torch.tensor([2, 2, 0, 3, 5, 5]))  # beams move within their sentences: rows stay
    assert shared.k is keys
    shared.select(torch.tensor([3, 4, 5]), torch.tensor([1]))  # the first sentence leaves
    assert torch.equal(shared.k, keys[[1]])


def test_first_keys_are_stored_contiguous_so_steps_read_them_in_place() -> None:
    """Cross-attention's keys arrive as a head-split view of the projected memory, (B, T, H, Dh) seen as
    (B, H, T, Dh); stored as given, every step's product would copy them into a contiguous batch first."""
    memory = torch.randn(3, 7, 2 * 4)  # (B, T, H*Dh)
    view = memory.view(3, 7, 2, 4).transpose(1, 2)  # (B, H, T, Dh), not contiguous
    cache = KVCache()
    k, v = cache.append(view, view)
    assert not view.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert torch.equal(k, view) and torch.equal(v, view)
    layer = MultiHeadAttention(d_model=8, num_heads=2, kernel=build_kernel("eager"))
    cross = StaticCache()
    with torch.no_grad():
        layer(torch.randn(3, 1, 8), memory=memory, cache=cross)
    assert cross.k.is_contiguous() and cross.v.is_contiguous()


def test_held_shows_the_stored_rows_and_the_reorder_and_replace_drops_it() -> None:
    """The ahead-of-time step reads the stored tensors and the held reorder (it gathers them itself), then
    stores what it computed from the kept rows: the reorder must not be applied a second time."""
    cache = KVCache()
    k0, v0 = step(3, t=2, seed=0)
    cache.append(k0, v0)
    cache.reorder(torch.tensor([2, 0, 0]))
    cache.reorder(torch.tensor([1, 1, 0]))  # composed: rows [0, 0, 2] of the stored tensors
    k, v, rows = cache.held()
    assert k is cache._k and v is cache._v and rows.tolist() == [0, 0, 2]
    grown = torch.cat([k.index_select(0, rows), step(3, seed=1)[0]], dim=2)
    cache.replace(grown, grown.clone())
    assert cache.pending is None and cache.k is grown  # no reorder applied on read
