"""The linformer kernel (Wang et al. 2020): equal to softmax attention where its projection is the identity,
padding never leaks, causal sites are refused with the reason, sharing ties what it says, and the static
cross-attention cache holds the projected rows, computed once per sentence."""

from __future__ import annotations

import pytest
import torch
from helpers.configs import CONF_DIR
from omegaconf import OmegaConf
from torch import Tensor

from app.attention import AttentionConfigError, MultiHeadAttention, build_kernel
from app.attention.base import repeat_kv
from app.attention.cache import ReducedCache
from app.attention.config import AttentionSpec, site_specs
from app.attention.factory import build_attention
from app.attention.kernels.linformer import LinformerAttention
from app.models import build_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TINY = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "d_ff": 64,
    "dropout": 0.0,
    "max_positions": 16,
}


def inputs(
    *, heads: int = 4, kv_heads: int = 4, tq: int = 5, tk: int = 7, padded: bool = True, seed: int = 0
):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(3, heads, tq, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(3, kv_heads, tk, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(3, kv_heads, tk, 8, generator=gen, dtype=torch.float64)
    key_mask = torch.arange(tk)[None, :] < torch.tensor([tk, tk - 2, 2])[:, None] if padded else None
    return q, k, v, key_mask


def identity_linformer(
    n: int, *, sharing: str = "headwise", max_len: int | None = None, kv_heads: int = 1
) -> LinformerAttention:
    kernel = build_kernel("linformer", k=n, sharing=sharing, max_len=max_len or n)
    kernel.bind(num_heads=4, num_kv_heads=kv_heads, head_dim=8)
    with torch.no_grad():
        for proj in (kernel.proj_k, kernel.proj_v):
            proj.zero_()
            proj[:, :, :n] = torch.eye(n)
    return kernel.double()


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("sharing", ["none", "headwise", "key_value"])
def test_identity_projections_with_k_equal_to_n_are_softmax_attention(
    kv_heads: int, padded: bool, sharing: str
) -> None:
    q, k, v, key_mask = inputs(kv_heads=kv_heads, padded=padded)
    # E = F = [I 0] (one per kv head for sharing=none): only the first 7 columns are used
    kernel = identity_linformer(7, sharing=sharing, max_len=9, kv_heads=kv_heads)
    assert kernel.proj_k.size(0) == (kv_heads if sharing == "none" else 1)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v)]
    got = kernel(*ours, key_mask=key_mask).context
    expected = build_kernel("eager")(*theirs, key_mask=key_mask).context
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(expected)
    for a, b in zip(
        torch.autograd.grad(got, ours, grad), torch.autograd.grad(expected, theirs, grad), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gradients_reach_the_projections_and_inputs() -> None:
    q, k, v, key_mask = inputs()
    kernel = build_kernel("linformer", k=4, max_len=7).double()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kernel(q, k, v, key_mask=key_mask).context.square().sum().backward()
    for tensor in (q, k, v, kernel.proj_k, kernel.proj_v):
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all() and tensor.grad.abs().sum() > 0
    # Padded positions of the shortest sentence receive no gradient in their keys and values.
    assert torch.all(k.grad[2, :, 2:] == 0) and torch.all(v.grad[2, :, 2:] == 0)


def test_padding_never_leaks() -> None:
    q, k, v, key_mask = inputs(kv_heads=2)
    kernel = build_kernel("linformer", k=3, max_len=7).double()
    out = kernel(q, k, v, key_mask=key_mask).context
    noise = torch.randn_like(k) * 100
    hidden = ~key_mask[:, None, :, None]
    changed = kernel(q, torch.where(hidden, noise, k), torch.where(hidden, -noise, v), key_mask=key_mask)
    torch.testing.assert_close(changed.context, out, rtol=0, atol=0)


def test_grouped_kv_heads_equal_repeated_kv_heads() -> None:
    q, k, v, key_mask = inputs(kv_heads=2)
    kernel = build_kernel("linformer", k=3, max_len=7).double()
    grouped = kernel(q, k, v, key_mask=key_mask).context
    repeated = kernel(q, repeat_kv(k, 4), repeat_kv(v, 4), key_mask=key_mask).context
    torch.testing.assert_close(grouped, repeated, rtol=1e-12, atol=1e-12)


def test_a_sentence_of_padding_only_gives_zero() -> None:
    q, k, v, _ = inputs()
    key_mask = torch.tensor([[True] * 7, [False] * 7, [True] + [False] * 6])
    out = build_kernel("linformer", k=4, max_len=7).double()(q, k, v, key_mask=key_mask).context
    assert torch.all(out[1] == 0) and out[2].abs().sum() > 0


def test_causal_use_is_refused_with_the_reason() -> None:
    q, k, v, _ = inputs()
    with pytest.raises(ValueError, match="cannot be causal: each projected key mixes all positions"):
        build_kernel("linformer", max_len=7)(q, k, v, causal=True)
    message = r"'linformer' cannot serve the decoder_self site: it lacks causal \(each projected key mixes"
    with pytest.raises(AttentionConfigError, match=message + r".*\+attention\.sites\.decoder_self\.kernel="):
        build_attention(AttentionSpec(kernel="linformer"), site="decoder_self", d_model=32, num_heads=4)
    with pytest.raises(AttentionConfigError, match="cannot serve the decoder_self site"):
        build_model(TINY, {"kernel": "linformer"}, src_vocab_size=20, tgt_vocab_size=20, pad_id=0)


def test_too_long_inputs_and_bad_options_are_named() -> None:
    q, k, v, _ = inputs(tk=7)
    with pytest.raises(ValueError, match=r"got 7 keys but its projections cover max_len=6"):
        build_kernel("linformer", max_len=6)(q, k, v)
    with pytest.raises(
        AttentionConfigError, match="unknown linformer sharing 'heads'; valid choices: none, headwise"
    ):
        build_kernel("linformer", sharing="heads")
    with pytest.raises(AttentionConfigError, match=r"linformer attention k=0 must be an integer >= 1"):
        build_kernel("linformer", k=0)


def linformer_model(sharing: str) -> torch.nn.Module:
    attention = {"kernel": "linformer", "k": 4, "sharing": sharing, "max_len": 16}
    attention["sites"] = {"decoder_self": {"kernel": "eager"}}
    torch.manual_seed(0)
    return build_model(TINY, attention, src_vocab_size=20, tgt_vocab_size=20, pad_id=0)


def projections(model: torch.nn.Module) -> list[Tensor]:
    kernels = [layer.self_attn.kernel for layer in model.encoder] + [
        layer.cross_attn.kernel for layer in model.decoder
    ]
    return [p for kernel in kernels for p in (kernel.proj_k, kernel.proj_v)]


@pytest.mark.parametrize(
    ("sharing", "distinct"), [("none", 8), ("headwise", 8), ("key_value", 4), ("layerwise", 2)]
)
def test_sharing_ties_the_papers_parameters(sharing: str, distinct: int, tmp_path) -> None:
    # 2 encoder layers and 2 cross-attention layers, E and F each: the paper's section 4 options.
    model = linformer_model(sharing)
    assert len({id(p) for p in projections(model)}) == distinct
    heads = TINY["num_heads"] if sharing == "none" else 1  # sharing=none: one E and F per kv head
    assert {tuple(p.shape) for p in projections(model)} == {(heads, 4, 16)}
    encoder_e = model.encoder[0].self_attn.kernel.proj_k
    cross_e = model.decoder[0].cross_attn.kernel.proj_k
    assert encoder_e is not cross_e  # sites never share
    # Tied parameters stay tied through a state-dict round trip.
    torch.save(model.state_dict(), tmp_path / "model.pt")
    again = linformer_model(sharing)
    again.load_state_dict(torch.load(tmp_path / "model.pt"))
    assert len({id(p) for p in projections(again)}) == distinct
    for a, b in zip(projections(model), projections(again), strict=True):
        assert torch.equal(a, b)


def test_cross_attention_caches_the_projected_rows_once_per_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        d_model=32, num_heads=4, num_kv_heads=2, kernel=build_kernel("linformer", k=3, max_len=8)
    ).eval()
    x, memory = torch.randn(3, 4, 32), torch.randn(3, 6, 32)
    mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4, [True] * 6])
    full, _ = layer(x, memory=memory, key_mask=mask)
    calls = []
    reduce = layer.kernel.reduce
    monkeypatch.setattr(layer.kernel, "reduce", lambda *a: calls.append(1) or reduce(*a))
    cache = layer.kernel.new_cache(cross=True)
    assert isinstance(cache, ReducedCache)
    steps = [layer(x[:, t : t + 1], memory=memory, key_mask=mask, cache=cache)[0] for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)
    assert len(calls) == 1  # the encoder output is projected on the first step only
    assert cache.k.shape == cache.v.shape == (3, 2, 3, 8) and cache.key_mask.shape == (3, 1, 3)
    before = cache.nbytes()
    cache.select(torch.tensor([2, 0]), torch.tensor([2, 0]))  # finished rows keep the projected rows' mask
    assert cache.k.shape[0] == cache.key_mask.shape[0] == 2 and cache.nbytes() < before


def test_the_group_config_puts_eager_at_the_decoder_self_site() -> None:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / "linformer.yaml"))
    raw.pop("defaults")
    raw["max_len"] = 16
    specs = site_specs(raw)
    assert [specs[s].kernel for s in ("encoder_self", "decoder_self", "cross")] == [
        "linformer",
        "eager",
        "linformer",
    ]
    assert specs["decoder_self"].options == {}


def test_unshared_projections_give_each_kv_head_its_own_rows() -> None:
    torch.manual_seed(0)
    kernel = build_kernel("linformer", k=3, sharing="none", max_len=8)
    layer = MultiHeadAttention(d_model=32, num_heads=4, num_kv_heads=2, kernel=kernel)
    assert layer.kernel.proj_k.shape == layer.kernel.proj_v.shape == (2, 3, 8)
    k = torch.randn(1, 1, 6, 8).expand(1, 2, -1, -1)  # both kv heads hold the same keys
    rows, _, _ = layer.kernel.reduce(k, k, None)
    assert not torch.allclose(rows[0, 0], rows[0, 1])  # yet their projections differ


def test_a_linformer_chosen_for_one_site_covers_model_max_positions() -> None:
    """A kernel switched at one site starts without the group's options, so a per-site linformer used to get
    its constructor's max_len of 256: a 280-token source then failed in a model of max_positions 300."""
    attention = {"kernel": "eager", "sites": {"cross": {"kernel": "linformer", "k": 4}}}
    model = build_model(
        {**TINY, "max_positions": 300}, attention, src_vocab_size=20, tgt_vocab_size=20, pad_id=0
    ).eval()
    kernel = model.decoder[0].cross_attn.kernel
    assert kernel.max_len == 300 and kernel.proj_k.shape[-1] == 300
    src = torch.randint(1, 20, (1, 280))
    assert model(src, torch.randint(1, 20, (1, 5))).shape == (1, 5, 20)


def test_a_sites_own_max_len_wins_over_model_max_positions() -> None:
    attention = {"kernel": "eager", "sites": {"cross": {"kernel": "linformer", "k": 4, "max_len": 32}}}
    specs = site_specs(attention, max_positions=300)
    assert specs["cross"].options == {"k": 4, "max_len": 32}
    assert specs["encoder_self"].options == {}  # the eager sites have no length option to set


def per_head_reference(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor, kernel: LinformerAttention
) -> Tensor:
    """softmax over each head's own projected rows, a row hidden where that head's E and F give no weight
    to a real key (the module docstring's rule, head by head; MHA: one key/value head per query head)."""
    out = torch.zeros_like(q)
    real = key_mask.to(q.dtype)  # (B, Tk)
    for h in range(q.size(1)):
        proj_k, proj_v = kernel.proj_k[h].double(), kernel.proj_v[h].double()  # (k, Tk)
        rows_k = proj_k @ (k[:, h] * real[..., None])  # (B, k, Dh)
        rows_v = proj_v @ (v[:, h] * real[..., None])
        seen = real @ (proj_k.abs() + proj_v.abs()).T > 0  # (B, k)
        scores = q[:, h] @ rows_k.transpose(-1, -2) / 8**0.5  # (B, Tq, k)
        weights = torch.softmax(scores.masked_fill(~seen[:, None], float("-inf")), dim=-1)
        out[:, h] = weights.nan_to_num(0.0) @ rows_v
    return out


def test_unshared_heads_hide_the_rows_only_padding_reaches_head_by_head() -> None:
    """``sharing=none``: head 0's first projected row reads the last key, the other heads' the first one.
    Where the last key is padding, head 0 must hide that row although the other heads' same row is real."""
    q, k, v, _ = inputs()
    key_mask = torch.tensor([[True] * 7, [True] * 5 + [False] * 2, [True] * 2 + [False] * 5])
    kernel = build_kernel("linformer", k=3, sharing="none", max_len=7)
    kernel.bind(num_heads=4, num_kv_heads=4, head_dim=8)
    kernel = kernel.double()
    with torch.no_grad():
        for proj in (kernel.proj_k, kernel.proj_v):
            proj.zero_()
            proj[:, 0, 0] = 1.0  # row 0 reads key 0 ...
            proj[0, 0] = 0.0
            proj[0, 0, 6] = 1.0  # ... except in head 0, where it reads the last key
            proj[:, 1:, 1] = 0.5  # rows 1 and 2 read key 1, which is real in every sentence
    out = kernel(q, k, v, key_mask=key_mask).context
    torch.testing.assert_close(out, per_head_reference(q, k, v, key_mask, kernel), rtol=1e-12, atol=1e-12)
