"""The attention axes compose: every registered kernel x head layout x site rule builds and decodes, and
kernels and mechanisms describe themselves (labels, KV-cache bytes) without per-name branches elsewhere."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from app.attention import (
    AttentionConfigError,
    MultiHeadAttention,
    available_kernels,
    build_kernel,
)
from app.attention.additive import AdditiveAttention
from app.attention.config import describe_attention, site_specs
from app.attention.factory import SITE_NEEDS, check_kernel_fits_site
from app.attention.luong import GeneralAttention
from app.attention.registry import kernel_class
from app.decoding.beam import beam_search
from app.decoding.greedy import greedy_search
from app.models import build_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD, BOS, EOS, VOCAB = 0, 1, 2, 30
TINY = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 1,
    "decoder_layers": 2,
    "d_ff": 64,
    "dropout": 0.0,
    "max_positions": 64,
}
HEAD_DIM = TINY["d_model"] // TINY["num_heads"]
LAYOUTS = {"mha": None, "gqa": 2, "mqa": 1}  # num_kv_heads of the heads group's options
SITE_RULES = {  # the kernel everywhere, or (as conf/attention/{sparse,lsh,linformer}.yaml do) one dense site
    "all_sites": {},
    "dense_cross": {"sites": {"cross": {"kernel": "eager"}}},
    "dense_decoder_self": {"sites": {"decoder_self": {"kernel": "eager"}}},
}
# Settings small enough that sparse patterns, linear and LSH chunks and Linformer's projection take effect
# at these lengths (k=4 rows for up to 8 keys).
SMALL_OPTIONS: dict[str, dict[str, Any]] = {
    "sparse": {"window": 2, "block": 4},
    "linear": {"chunk_size": 3},
    "lsh": {"chunk_size": 1, "n_buckets": 2, "n_hashes": 2},
    "linformer": {"k": 4, "max_len": TINY["max_positions"]},
}
COMBINATIONS = list(itertools.product(available_kernels(), LAYOUTS, SITE_RULES))


def attention_config(kernel: str, layout: str, rule: str) -> dict[str, Any]:
    return {
        "kernel": kernel,
        "num_kv_heads": LAYOUTS[layout],
        **SMALL_OPTIONS.get(kernel, {}),
        **SITE_RULES[rule],
    }


def fits(attention: dict[str, Any]) -> bool:
    """Whether every site's kernel has the capabilities the site needs."""
    try:
        for site, spec in site_specs(attention).items():
            check_kernel_fits_site(spec.kernel, site)
    except AttentionConfigError:
        return False
    return True


@pytest.mark.parametrize(("kernel", "layout", "rule"), COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def test_every_combination_builds_and_decodes_with_its_cache(kernel: str, layout: str, rule: str) -> None:
    attention = attention_config(kernel, layout, rule)
    if not fits(attention):
        with pytest.raises(AttentionConfigError, match=kernel):
            build_model(TINY, attention, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=PAD)
        return
    torch.manual_seed(0)
    model = build_model(TINY, attention, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=PAD).eval()
    kv_heads = LAYOUTS[layout] or TINY["num_heads"]
    assert {m.num_kv_heads for m in model.modules() if isinstance(m, MultiHeadAttention)} == {kv_heads}
    src = torch.tensor([[5, 6, 7, 8, 9, 10, EOS], [11, 12, 13, EOS, PAD, PAD, PAD]])
    limits = torch.tensor([9, 7])
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, limits=limits, banned=(PAD, BOS))
    assert all(len(tokens) <= limit for tokens, limit in zip(greedy, limits.tolist(), strict=True))
    # Cached step-by-step decoding gives what a full forward pass gives at every position.
    tgt_in = torch.tensor([[BOS, 4, 5, 6, 7, 8, 9, 10], [BOS, 11, 12, 13, 14, 15, 16, 17]])  # (2, T)
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt_in).float(), dim=-1)  # (2, T, V)
        state = model.start_decoding(model.encode(src))
        steps = torch.stack([model.decode_step(tgt_in[:, t], state) for t in range(tgt_in.size(1))], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    beams = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, limits=limits, banned=(PAD, BOS))
    assert len(beams) == 2 and all(
        len(hyp) <= limit for hyp, limit in zip(beams, limits.tolist(), strict=True)
    )


def test_a_kernel_that_cannot_serve_a_site_is_refused_at_build_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.attention.base import KernelCapabilities

    monkeypatch.setattr(kernel_class("sdpa"), "capabilities", KernelCapabilities(incremental=False))
    assert SITE_NEEDS["cross"]["incremental"]
    attention = attention_config("sdpa", "gqa", "all_sites")
    assert not fits(attention)
    with pytest.raises(AttentionConfigError, match=r"kernel 'sdpa' cannot serve the decoder_self site"):
        build_model(TINY, attention, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=PAD)
    assert fits(attention_config("sdpa", "gqa", "dense_cross")) is False  # decoder self still needs it


@pytest.mark.parametrize("num_kv_heads", [3, 0, 8])
def test_a_head_layout_that_does_not_divide_the_heads_is_refused(num_kv_heads: int) -> None:
    with pytest.raises(AttentionConfigError, match=rf"num_kv_heads={num_kv_heads} must divide num_heads=4"):
        build_model(
            TINY,
            {"kernel": "sdpa", "num_kv_heads": num_kv_heads},
            src_vocab_size=9,
            tgt_vocab_size=9,
            pad_id=0,
        )


# --- self-descriptions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kernel", "options", "label"),
    [
        ("eager", {}, "eager"),
        ("sdpa", {}, "sdpa"),
        ("flash", {"backend": "math"}, "flash backend=math"),
        ("sparse", {"window": 8}, "sparse sliding_window window=8"),
        ("sparse", {"pattern": "strided", "window": 4, "stride": 3}, "sparse strided window=4 stride=3"),
        ("sparse", {"pattern": "fixed", "stride": 8, "summary": 2}, "sparse fixed stride=8 summary=2"),
        ("sparse", {"pattern": "global_window", "num_global": 2}, "sparse global_window window=64 global=2"),
        ("linear", {}, "linear elu"),
        ("linear", {"feature_map": "favor", "num_features": 32}, "linear favor m=32"),
        ("linformer", {}, "linformer k=64 headwise"),
        ("linformer", {"k": 32, "sharing": "key_value"}, "linformer k=32 key_value"),
        ("lsh", {}, "lsh buckets=8 hashes=4 chunk=64"),
    ],
)
def test_kernels_describe_themselves(kernel: str, options: dict[str, Any], label: str) -> None:
    assert build_kernel(kernel, **options).describe() == label


def test_attention_configs_are_described_from_their_parts() -> None:
    assert describe_attention({"kernel": "sdpa", "num_kv_heads": 2}) == "sdpa kv=2"
    sparse = {"kernel": "sparse", "window": 8, "num_kv_heads": None, "sites": {"cross": {"kernel": "eager"}}}
    assert describe_attention(sparse) == "sparse sliding_window window=8 cross=eager"
    gqa_sparse = {**sparse, "num_kv_heads": 2}
    assert describe_attention(gqa_sparse) == "sparse sliding_window window=8 kv=2 cross=eager"
    gqa_sparse["sites"] = {"cross": {"kernel": "eager", "num_kv_heads": 1}}
    assert describe_attention(gqa_sparse) == "sparse sliding_window window=8 kv=2 cross=eager kv=1"
    rnn = {"mechanism": "general", "decoder": "luong", "input_feeding": True, "num_kv_heads": None}
    assert describe_attention(rnn) == "luong general"
    assert describe_attention({"mechanism": "additive", "decoder": "bahdanau", "attention_size": 64}) == (
        "bahdanau additive attention_size=64"
    )


def test_mechanisms_describe_themselves() -> None:
    assert AdditiveAttention.describe({"attention_size": None}) == "additive"
    assert AdditiveAttention.describe({"attention_size": 128}) == "additive attention_size=128"
    assert GeneralAttention.describe({}) == "general"


def decoded_cache_bytes(kernel: str, options: dict[str, Any], num_kv_heads: int, length: int) -> int:
    """What the decoder self-attention cache of one layer actually holds after ``length`` cached steps."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        d_model=TINY["d_model"],
        num_heads=TINY["num_heads"],
        num_kv_heads=num_kv_heads,
        kernel=build_kernel(kernel, **options),
    ).eval()
    cache = layer.kernel.new_cache(cross=False)
    x = torch.randn(1, length, TINY["d_model"])
    with torch.no_grad():
        for t in range(length):
            layer(x[:, t : t + 1], causal=True, cache=cache)
    return cache.nbytes()


@pytest.mark.parametrize("length", [1, 5, 12])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize(
    ("kernel", "options"),
    [
        ("eager", {}),
        ("sdpa", {}),
        ("sparse", {"window": 3}),
        ("sparse", {"pattern": "strided", "window": 2, "stride": 3}),
        ("linear", {}),
        ("linear", {"feature_map": "favor", "num_features": 5}),
        ("lsh", {"chunk_size": 2, "n_buckets": 2}),
    ],
    ids=["eager", "sdpa", "sparse_window", "sparse_strided", "linear_elu", "linear_favor", "lsh"],
)
def test_cache_bytes_match_what_decoding_keeps(
    kernel: str, options: dict[str, Any], num_kv_heads: int, length: int
) -> None:
    expected = build_kernel(kernel, **options).cache_bytes(
        length, num_kv_heads=num_kv_heads, head_dim=HEAD_DIM, dtype=torch.float32
    )
    assert expected == decoded_cache_bytes(kernel, options, num_kv_heads, length)


def cache_bytes(kernel: str, length: int, num_kv_heads: int, **options: Any) -> int:
    return build_kernel(kernel, **options).cache_bytes(
        length, num_kv_heads=num_kv_heads, head_dim=64, dtype=torch.bfloat16
    )


def test_cache_bytes_ratios_of_head_layouts_windows_and_recurrent_state() -> None:
    mha, gqa, mqa = (cache_bytes("sdpa", 100, kv) for kv in (8, 2, 1))
    assert mha == 2 * 8 * 100 * 64 * 2  # k and v, 8 heads, 100 tokens, 64 wide, 2 bytes
    assert (mha / gqa, mha / mqa) == (4, 8)
    assert cache_bytes("sdpa", 200, 8) == 2 * mha  # a full cache grows with every token
    window = [cache_bytes("sparse", length, 8, window=15) for length in (10, 16, 100, 1000)]
    assert window == [mha // 10, mha // 100 * 16, mha // 100 * 16, mha // 100 * 16]  # window + 1 positions
    assert cache_bytes("sparse", 100, 8, window=15, num_global=1) == mha  # global tokens need every key
    linear = [cache_bytes("linear", length, 8) for length in (1, 100, 10_000)]
    assert len(set(linear)) == 1 and linear[0] == 8 * (64 * 64 + 64) * 4  # fp32 state, whatever the length
    assert cache_bytes("linear", 100, 2) * 4 == linear[0]


def test_scores_per_query_reflect_what_each_kernel_materialises() -> None:
    def scores(kernel: str, length: int, **options: Any) -> int:
        return build_kernel(kernel, **options).scores_per_query(length, head_dim=64)

    assert scores("eager", 4096) == 2 * scores("eager", 2048) > 0
    assert scores("sdpa", 4096) == scores("flash", 4096) == 0
    assert scores("sparse", 4096, window=32) == scores("sparse", 8192, window=32) < scores("eager", 4096)
    assert scores("linear", 4096) == scores("linear", 8192) < scores("eager", 4096)
    assert scores("linformer", 4096, k=256) == scores("linformer", 8192, k=256) < scores("eager", 4096) // 8
    lsh = scores("lsh", 4096, chunk_size=64, n_hashes=4)
    assert lsh == scores("lsh", 8192, chunk_size=64, n_hashes=4) < scores("eager", 4096)
