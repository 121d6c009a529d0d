"""Attention converted on a trained model at init_from time (app/attention/convert.py): key/value heads
mean-pooled per group (GQA/MQA), kernels taken as they are or given their parameters by a stated rule, a
shared-QK kernel's key projection dropped, each conversion said in the log, one line per tensor kind."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from helpers.models import TINY_TRANSFORMER

from app.attention.convert import convert_state, regroup
from app.attention.registry import AttentionConfigError
from app.checkpoint import CheckpointError, LoadedModel
from app.models import build_model
from app.models.seq2seq import Seq2Seq
from app.training.warm_start import load_weights

VOCAB = 24
HEADS, HEAD_DIM = TINY_TRANSFORMER["num_heads"], TINY_TRANSFORMER["d_model"] // TINY_TRANSFORMER["num_heads"]


def tiny(attention: dict[str, Any], seed: int = 0, **model: Any) -> Seq2Seq:
    torch.manual_seed(seed)
    config = TINY_TRANSFORMER | model
    return build_model(config, attention, src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=0).eval()


def converted(source: Seq2Seq, attention: dict[str, Any]) -> tuple[Seq2Seq, list[str]]:
    """A model with ``attention`` (other random weights), holding ``source``'s weights converted."""
    target = tiny(attention, seed=1)
    conversion = convert_state(source, target)
    target.load_state_dict(conversion.state)
    return target, conversion.notes()


def log_probs(model: Seq2Seq) -> torch.Tensor:
    """Teacher-forced outputs on a fixed padded batch (short enough for every kernel here)."""
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 13, 2, 0, 0, 0]])
    tgt = torch.tensor([[1, 14, 15, 16, 17], [1, 18, 19, 0, 0]])
    with torch.no_grad():
        return model(src, tgt).log_softmax(-1)


@pytest.mark.parametrize("groups", [2, 1])
def test_keys_and_values_are_mean_pooled_per_group(groups: int) -> None:
    """Kv head g of the converted layer is the mean of the trained heads g*r .. g*r+r-1 (r = H / G), the
    heads whose queries it serves (repeat_kv's order), in every projection's weight and bias."""
    source = tiny({"kernel": "eager"})
    target, notes = converted(source, {"kernel": "eager", "num_kv_heads": groups})
    r = HEADS // groups
    for site in ("encoder.0.self_attn", "decoder.0.self_attn", "decoder.0.cross_attn"):
        old, new = source.get_submodule(site), target.get_submodule(site)
        for proj in ("k_proj", "v_proj"):
            for leaf in ("weight", "bias"):
                trained = getattr(getattr(old, proj), leaf)
                pooled = getattr(getattr(new, proj), leaf)
                assert pooled.shape[0] == groups * HEAD_DIM
                for g in range(groups):
                    heads = [trained[h * HEAD_DIM : (h + 1) * HEAD_DIM] for h in range(g * r, (g + 1) * r)]
                    torch.testing.assert_close(pooled[g * HEAD_DIM : (g + 1) * HEAD_DIM], sum(heads) / r)
        for proj in ("q_proj", "out_proj"):
            torch.testing.assert_close(getattr(new, proj).weight, getattr(old, proj).weight, rtol=0, atol=0)
    assert (
        f"k_proj.weight at decoder.*.cross_attn, decoder.*.self_attn, encoder.*.self_attn (3 tensors): "
        f"mean-pooled per group, {HEADS} -> {groups} key/value heads" in notes[0]
    )
    assert len(notes) == 5 and notes[-1].endswith("tensors: copied as they are")  # k/v weight/bias, the rest


def test_as_many_groups_as_heads_changes_nothing() -> None:
    source = tiny({"kernel": "eager"})
    target, notes = converted(source, {"kernel": "eager", "num_kv_heads": HEADS})
    assert notes == []
    torch.testing.assert_close(log_probs(target), log_probs(source), rtol=0, atol=0)


def test_pooling_heads_that_agree_within_their_group_keeps_the_outputs() -> None:
    """Where each group's trained heads are already equal, the pooled model computes what MHA did: the
    grouping of query heads onto the pooled kv heads is the right one (a wrong order would change it)."""
    source = tiny({"kernel": "eager"})
    with torch.no_grad():
        for layer in (m for m in source.modules() if hasattr(m, "num_kv_heads")):
            for proj in (layer.k_proj, layer.v_proj):
                for tensor in (proj.weight, proj.bias):
                    heads = tensor.view(2, 2, HEAD_DIM, -1)  # (G, r, Dh, D | 1): pairs of heads
                    heads[:, 1] = heads[:, 0]
    target, _ = converted(source, {"kernel": "eager", "num_kv_heads": 2})
    torch.testing.assert_close(log_probs(target), log_probs(source))


def test_fewer_kv_heads_to_more_repeats_them_and_changes_nothing() -> None:
    source = tiny({"kernel": "eager", "num_kv_heads": 1})
    target, notes = converted(source, {"kernel": "eager"})
    assert "each head repeated, 1 -> 4 key/value heads" in notes[0]
    torch.testing.assert_close(log_probs(target), log_probs(source))


def test_a_layout_no_pooling_reaches_is_refused() -> None:
    with pytest.raises(AttentionConfigError, match="cannot convert 4 key/value heads to 6"):
        regroup(torch.zeros(4 * 8, 16), 4, 6, 8)


def test_linformer_starts_as_the_trained_softmax_layer_on_inputs_up_to_k() -> None:
    """E = F = identity on the first k positions: on inputs of at most k tokens the converted model is the
    trained one (before any uptraining), whatever the sharing."""
    source = tiny({"kernel": "eager"})
    for sharing in ("headwise", "none", "layerwise"):
        attention = {
            "kernel": "linformer",
            "k": 8,
            "sharing": sharing,
            "sites": {"decoder_self": {"kernel": "eager"}},
        }
        target, notes = converted(source, attention)
        torch.testing.assert_close(log_probs(target), log_probs(source))
        assert "E = F = identity on the first 8 positions, 0 beyond" in notes[0]
    assert notes[0].startswith("kernel.proj_k at decoder.*.cross_attn, encoder.*.self_attn (2 tensors): new")


def test_kernels_without_parameters_take_the_weights_as_they_are() -> None:
    """Linear attention with a fixed feature map (elu here): nothing new, nothing dropped."""
    source = tiny({"kernel": "eager"})
    target, notes = converted(source, {"kernel": "linear"})
    assert (
        len(notes) == 2 and "elu feature map is fixed, not learned (attention.feature_map=favor" in notes[0]
    )
    assert notes[0].startswith(
        "kernel at decoder.*.cross_attn, decoder.*.self_attn, encoder.*.self_attn (3 layers)"
    )
    for name, tensor in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], tensor)


def test_a_learned_feature_map_starts_from_the_softmax_estimate() -> None:
    """linear favor learned: W is new, one orthogonal random draw per kv head (seed + head), where
    phi(q).phi(k) estimates the trained exp(q.k / sqrt(d)); the trained projections are kept."""
    from app.attention.kernels.linear import orthogonal_random_features

    source = tiny({"kernel": "eager"})
    learned = {"kernel": "linear", "feature_map": "favor", "num_features": 8, "seed": 3, "learned": True}
    target, notes = converted(source, learned | {"num_kv_heads": 2})
    note = next(note for note in notes if note.startswith("kernel.weight at "))
    assert "decoder.*.cross_attn, decoder.*.self_attn, encoder.*.self_attn (3 tensors): new" in note
    assert "W = orthogonal random features (seed 3 + head), learned from there" in note
    weight = target.get_submodule("encoder.0.self_attn").kernel.weight
    assert weight.shape == (2, 8, HEAD_DIM)
    for head in range(2):
        torch.testing.assert_close(weight[head], orthogonal_random_features(8, HEAD_DIM, 3 + head).float())
    state = target.state_dict()
    assert torch.equal(
        state["encoder.0.self_attn.q_proj.weight"], source.state_dict()["encoder.0.self_attn.q_proj.weight"]
    )


def test_a_shared_qk_kernel_drops_the_trained_key_projection_and_says_so() -> None:
    source = tiny({"kernel": "eager"})
    lsh = {
        "kernel": "lsh",
        "n_buckets": 1,
        "chunk_size": 64,
        "exclude_self": False,
        "sites": {"cross": {"kernel": "eager"}},
    }
    shared, notes = converted(source, lsh | {"shared_qk": True})
    assert shared.encoder[0].self_attn.k_proj is None
    assert notes[0].startswith(
        "k_proj.weight at decoder.*.self_attn, encoder.*.self_attn (2 tensors): dropped"
    )
    assert "attention.shared_qk=false keeps it" in notes[0]
    # separate keys, one bucket, a window over every key and no self rule: softmax attention, unchanged
    separate, _ = converted(source, lsh | {"shared_qk": False})
    torch.testing.assert_close(log_probs(separate), log_probs(source))
    back, notes = converted(shared, {"kernel": "eager"})  # and back: the keys from the query projection
    assert "new, from q_proj.weight (4 -> 4 heads)" in notes[0]
    torch.testing.assert_close(
        back.encoder[0].self_attn.k_proj.weight, shared.encoder[0].self_attn.q_proj.weight
    )


def test_a_warm_start_converts_and_logs_or_refuses_what_is_no_conversion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = tiny({"kernel": "eager"})
    start = LoadedModel(source, None, None, {"model": TINY_TRANSFORMER, "attention": {"kernel": "eager"}})  # type: ignore[arg-type]
    target = tiny({"kernel": "eager", "num_kv_heads": 1}, seed=1)
    with caplog.at_level(logging.INFO, logger="app.training.warm_start"):
        load_weights(target, start, {}, source="base.ckpt")
    assert "init_from=base.ckpt: attention converted: k_proj.weight at" in caplog.text
    wider = tiny({"kernel": "eager"}, d_ff=32)
    config = {"model": TINY_TRANSFORMER | {"d_ff": 32}, "attention": {"kernel": "eager"}}
    with pytest.raises(CheckpointError, match=r"do not fit .* model.d_ff=32 vs 64"):
        load_weights(wider, start, config, source="base.ckpt")
