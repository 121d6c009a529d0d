"""``attention=linformer`` and ``attention=lsh`` are legal as plain overrides of the quickstart experiment
(each YAML puts eager at the site its kernel cannot serve), compose with ``heads=`` and per-site overrides,
and the model they build trains (forward + backward) and decodes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.configs import compose_config
from omegaconf import OmegaConf

from app.attention import AttentionConfigError, MultiHeadAttention
from app.attention.config import describe_attention
from app.decoding.greedy import greedy_search
from app.models import build_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD, BOS, EOS, VOCAB = 0, 1, 2, 40
# The quickstart experiment's architecture (3+3 layers, 4 heads), narrowed so that it builds in milliseconds.
TINY = ["model.d_model=32", "model.d_ff=64", "model.max_positions=32"]
SMALL_KERNEL = {"lsh": ["attention.chunk_size=1", "attention.n_buckets=2"], "linformer": ["attention.k=4"]}


def build(*overrides: str, tmp_path: Path) -> tuple[dict, torch.nn.Module]:
    cfg = compose_config("experiment=quickstart", *TINY, *overrides, tmp_path=tmp_path)
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    torch.manual_seed(0)
    model = build_model(model_cfg, attention, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=PAD)
    return attention, model


def kernels_by_site(model: torch.nn.Module) -> dict[str, set[str]]:
    return {
        "encoder_self": {type(layer.self_attn.kernel).name for layer in model.encoder},
        "decoder_self": {type(layer.self_attn.kernel).name for layer in model.decoder},
        "cross": {type(layer.cross_attn.kernel).name for layer in model.decoder},
    }


@pytest.mark.parametrize(
    ("attention", "sites"),
    [
        ("linformer", {"encoder_self": {"linformer"}, "decoder_self": {"eager"}, "cross": {"linformer"}}),
        ("lsh", {"encoder_self": {"lsh"}, "decoder_self": {"lsh"}, "cross": {"eager"}}),
    ],
)
@pytest.mark.parametrize("heads", ["mha", "gqa", "mqa"])
def test_quickstart_with_each_kernel_trains_and_decodes(
    attention: str, sites: dict[str, set[str]], heads: str, tmp_path: Path
) -> None:
    config, model = build(
        f"attention={attention}", f"heads={heads}", *SMALL_KERNEL[attention], tmp_path=tmp_path
    )
    assert (len(model.encoder), len(model.decoder)) == (3, 3)
    assert kernels_by_site(model) == sites
    if attention == "linformer":  # max_len follows model.max_positions
        assert config["max_len"] == 32 and model.encoder[0].self_attn.kernel.proj_k.shape == (1, 4, 32)
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, EOS], [14, 15, 16, EOS] + [PAD] * 6])
    tgt_in = torch.tensor([[BOS, 4, 5, 6, 7, 8, 9, 10, 11], [BOS, 12, 13, 14, 15, 16, 17, 18, 19]])
    model.train()
    logits = model(src, tgt_in)  # (B, T, V)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_in.roll(-1, dims=1).flatten())
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    model.eval()
    limits = torch.tensor([6, 6])
    hyps = greedy_search(model, src, bos_id=BOS, eos_id=EOS, limits=limits, banned=(PAD, BOS))
    assert len(hyps) == 2 and all(len(h) <= 6 for h in hyps)
    with torch.no_grad():  # cached decoding reproduces the full pass
        full = torch.log_softmax(model(src, tgt_in).float(), dim=-1)
        state = model.start_decoding(model.encode(src))
        steps = torch.stack([model.decode_step(tgt_in[:, t], state) for t in range(tgt_in.size(1))], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)


def test_per_site_overrides_place_the_new_kernels(tmp_path: Path) -> None:
    # Sparse self-attention with Linformer cross-attention, the mix the length sweep asks for.
    _, model = build(
        "attention=sparse",
        "attention.sites.cross.kernel=linformer",
        "+attention.sites.cross.k=4",
        "+attention.sites.cross.max_len=32",
        tmp_path=tmp_path,
    )
    assert kernels_by_site(model) == {
        "encoder_self": {"sparse"},
        "decoder_self": {"sparse"},
        "cross": {"linformer"},
    }
    # Eager everywhere except LSH in the encoder.
    _, model = build("+attention.sites.encoder_self.kernel=lsh", tmp_path=tmp_path)
    assert kernels_by_site(model) == {"encoder_self": {"lsh"}, "decoder_self": {"eager"}, "cross": {"eager"}}
    assert all(m.num_kv_heads == 4 for m in model.modules() if isinstance(m, MultiHeadAttention))


def test_the_labels_name_each_sites_kernel(tmp_path: Path) -> None:
    config, _ = build("attention=linformer", tmp_path=tmp_path)
    assert describe_attention(config) == "linformer k=64 headwise decoder_self=eager"
    config, _ = build("attention=lsh", tmp_path=tmp_path)
    assert describe_attention(config) == "lsh buckets=8 hashes=4 chunk=64 shared-qk cross=eager"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["attention=linformer", "attention.sites.decoder_self.kernel=linformer"], "mixes all positions"),
        (
            ["attention=lsh", "attention.sites.cross.kernel=lsh"],
            "LSH buckets relate positions of one sequence",
        ),
    ],
)
def test_removing_the_per_site_default_is_refused_with_the_reason(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    with pytest.raises(AttentionConfigError, match=message):
        build(*overrides, tmp_path=tmp_path)
