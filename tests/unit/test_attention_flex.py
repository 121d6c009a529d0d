"""The FlexAttention forms (``attention=flex``, ``attention=sparse backend=flex``) against the eager reference
under the same mask, in float64.

On the CPU ``flex_attention`` runs as its unfused reference and has no backward, so these tests run without
autograd (the kernels' forward through ``flex_attention`` itself); the registry-wide tests in
test_attention.py check the gradients, which the CPU computes from the same ``mask_mod`` densely. The
cached-vs-uncached decoding of a tiny Transformer with attention=flex is test_attention_axes.py's
``test_every_combination_builds_and_decodes_with_its_cache[flex-*]``; packed against padded at every site
with autograd is test_segments.py's ``flex`` and ``sparse_flex`` entries. The compiled kernel (CUDA only)
has the last test, skipped without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from app.attention import AttentionConfigError, build_kernel
from app.attention.kernels import flex_ops
from app.attention.segments import Segments
from app.models import build_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# (heads, kv_heads, tq, tk, padded, causal): each a form the padded API takes
# (test_attention.py's float32 comparison covers the other forms, and queries before the first key)
PADDED_CASES = {
    "causal_padded_gqa": (4, 2, 6, 6, True, True),
    "cross_mqa": (4, 1, 4, 6, True, False),  # cross-attention: Tq != Tk, keys of another sequence
}


def padded_inputs(heads: int, kv_heads: int, tq: int, tk: int, padded: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(3, heads, tq, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(3, kv_heads, tk, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(3, kv_heads, tk, 8, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([tk, tk - 2, 0])  # the last row is all padding: its context is zero
    key_mask = torch.arange(tk)[None, :] < lengths[:, None] if padded else None
    return q, k, v, key_mask


@pytest.mark.parametrize("case", PADDED_CASES.values(), ids=PADDED_CASES.keys())
@torch.no_grad()
def test_flex_equals_eager_on_padded_batches(case: tuple) -> None:
    *shape, padded, causal = case
    q, k, v, key_mask = padded_inputs(*shape, padded)
    got = build_kernel("flex")(q, k, v, key_mask=key_mask, causal=causal).context
    expected = build_kernel("eager")(q, k, v, key_mask=key_mask, causal=causal).context
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@torch.no_grad()
def test_packed_flex_equals_the_padded_reference() -> None:
    """The document mask over packed tokens gives what the padded layout gives (the base class's
    forward_packed on the eager kernel): self-attention, causal and not, and cross-attention between
    sequences of other lengths; the sparse window too, with positions restarting per sequence."""
    gen = torch.Generator().manual_seed(1)
    queries, keys = Segments.of_lengths([5, 1, 7]), Segments.of_lengths([3, 6, 2])
    q = torch.randn(queries.tokens, 4, 8, generator=gen, dtype=torch.float64)  # (Nq, H, Dh)
    k, v = (torch.randn(keys.tokens, 2, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    pairs = [
        (build_kernel("flex"), build_kernel("eager"), True),
        (build_kernel("sparse", window=1, backend="flex"), build_kernel("sparse", window=1), False),
    ]
    for kernel, reference, cross in pairs:  # the window: causal only (each call traces anew on the CPU)
        runs = [(queries, queries, q[:, :2], causal) for causal in ((False, True) if cross else (True,))]
        runs += [(queries, keys, None, False)] if cross else []  # self above: Hkv = 2 heads of q
        for q_seg, k_seg, keys_of_self, causal in runs:
            kk, vv = (q[:, :2], q[:, 2:]) if keys_of_self is not None else (k, v)
            got = kernel.forward_packed(q, kk, vv, q_segments=q_seg, k_segments=k_seg, causal=causal)
            want = reference.forward_packed(q, kk, vv, q_segments=q_seg, k_segments=k_seg, causal=causal)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@torch.no_grad()
def test_one_block_mask_per_forward_pass_shared_by_the_layers() -> None:
    """Two encoder and two decoder layers build three masks: the encoder's padding, the causal one and the
    cross-attention's padding. A new batch builds new padding masks; the causal one, a function of the
    shape alone, is kept."""
    tiny = {"family": "transformer", "d_model": 32, "num_heads": 4, "encoder_layers": 2, "decoder_layers": 2}
    tiny |= {"d_ff": 64, "dropout": 0.0, "max_positions": 32}
    model = build_model(tiny, {"kernel": "flex"}, src_vocab_size=20, tgt_vocab_size=20, pad_id=0).eval()
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    tgt = torch.tensor([[1, 4, 5, 6], [1, 7, 8, 9]])
    before = flex_ops.MASKS.built
    model(src, tgt)
    assert flex_ops.MASKS.built - before == 3
    model(src.clone(), tgt)  # another batch of the same shape: its own padding masks, not the last one's
    assert flex_ops.MASKS.built - before == 5


def test_a_sliding_window_block_mask_skips_the_tiles_outside_the_window() -> None:
    """Block sparsity, not a loop: at 2,048 positions (16 tiles of 128 a side) a window of 64 leaves each
    query tile at most three key tiles, a window of 512 up to nine; dense would be 16."""
    for window, most in ((64, 3), (512, 9)):
        kernel = build_kernel("sparse", window=window, backend="flex")
        mask_mod = kernel.flex_mask_mod(
            tq=2048, tk=2048, key_mask=None, causal=False, device=torch.device("cpu")
        )
        block_mask = create_block_mask(mask_mod, None, None, 2048, 2048, device="cpu")
        tiles = block_mask.kv_num_blocks  # (1, 1, 16): partial key tiles per query tile
        if block_mask.full_kv_num_blocks is not None:  # and those the pattern fills, kept apart
            tiles = tiles + block_mask.full_kv_num_blocks
        assert int(tiles.max()) == most and int(tiles.min()) == most // 2 + 1  # the first and last tiles


def test_flex_options_and_refusals_name_the_valid_choices() -> None:
    assert flex_ops.compiled_on("auto", torch.device("cuda")) and not flex_ops.compiled_on(
        "auto", torch.device("cpu")
    )
    assert flex_ops.compiled_on(True, torch.device("cpu"))
    with pytest.raises(AttentionConfigError, match=r"compile='yes'; valid choices: auto, true, false"):
        build_kernel("flex", compile="yes")
    with pytest.raises(AttentionConfigError, match=r"backend 'triton'; valid choices: blockwise, flex"):
        build_kernel("sparse", backend="triton")
    q, k, v, key_mask = padded_inputs(4, 4, 6, 6, True)
    with pytest.raises(ValueError, match=r"backend=flex cannot apply attention dropout .* backend=blockwise"):
        build_kernel("sparse", window=1, backend="flex")(q, k, v, key_mask=key_mask, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"flex kernel cannot apply attention dropout"):
        build_kernel("flex")(q, k, v, key_mask=key_mask, dropout_p=0.1)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the compiled FlexAttention kernel)"
)
def test_compiled_flex_on_the_gpu_equals_eager_with_gradients() -> None:
    """What the CPU cannot run: flex_attention compiled (compile=auto on CUDA), forward and backward, padded
    and packed, and the window as block sparsity; bf16 against eager's float32 on the same inputs. Lengths
    over one 128-tile and not a multiple of it, so tiles are skipped and the last one is partial."""
    gen = torch.Generator().manual_seed(0)
    lengths, tk = torch.tensor([300, 77]), 300
    q = torch.randn(2, 4, tk, 64, generator=gen)
    k, v = (torch.randn(2, 2, tk, 64, generator=gen) for _ in range(2))
    key_mask = (torch.arange(tk)[None, :] < lengths[:, None]).cuda()
    runs = {  # name: (kernel, reference, causal)
        "padding": (build_kernel("flex"), build_kernel("eager"), False),
        "causal": (build_kernel("flex"), build_kernel("eager"), True),
        "window": (
            build_kernel("sparse", window=40, backend="flex"),
            build_kernel("sparse", window=40),
            True,
        ),
    }
    for name, (kernel, reference, causal) in runs.items():
        ours = [t.cuda().bfloat16().requires_grad_() for t in (q, k, v)]
        theirs = [t.cuda().requires_grad_() for t in (q, k, v)]
        got = kernel(*ours, key_mask=key_mask, causal=causal).context
        want = reference(*theirs, key_mask=key_mask, causal=causal).context
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2, msg=lambda m, n=name: f"{n}: {m}")
        grads = torch.autograd.grad(got.float().sum(), ours)
        for g, r in zip(grads, torch.autograd.grad(want.sum(), theirs), strict=True):
            torch.testing.assert_close(g.float(), r, rtol=5e-2, atol=5e-2, msg=lambda m, n=name: f"{n}: {m}")
    segments = Segments.of_lengths([130, 7, 250], device="cuda")
    packed = [torch.randn(segments.tokens, heads, 64, device="cuda") for heads in (4, 2, 2)]  # q, k, v
    for causal in (False, True):
        got = build_kernel("flex").forward_packed(
            *(t.bfloat16() for t in packed), q_segments=segments, k_segments=segments, causal=causal
        )
        want = build_kernel("eager").forward_packed(
            *packed, q_segments=segments, k_segments=segments, causal=causal
        )
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)
