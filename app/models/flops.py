"""Model FLOPs of a training step, counted from the model's shapes on the real (unpadded) lengths.

Model FLOP utilisation (MFU, Chowdhery et al. 2022, appendix B) compares the arithmetic a model *needs*
with what the hardware can do; padding, recomputation and kernel overheads are not counted as useful
work. A multiply-add is 2 FLOPs. For one sentence pair with S source and T target tokens (EOS and BOS
included, padding excluded) and attention width A = heads x head_dim, the forward pass of a Transformer
needs

    encoder, per layer:  S x linear(self-attention q, k, v, out + FFN)  +  4 S^2 A        (scores, context)
    decoder, per layer:  T x linear(self q, k, v, out + cross q, out + FFN)  +  S x linear(cross k, v)
                         +  4 A T(T+1)/2  (causal self-attention)  +  4 T S A  (cross-attention)
    output layer:        T x 2 d_model x vocabulary

where linear(...) is 2 x in x out summed over the named projections (biases, norms, softmax and
embeddings are left out: they are a few percent at most). The backward pass costs twice the forward
(gradients for activations and for weights), so a training step is 3 x forward. Attention is counted
as dense softmax attention whatever the kernel: sparse and linear kernels do less arithmetic for the
same model, and counting the dense figure keeps MFU comparable across kernels ("model" FLOPs).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from app.attention.multihead import MultiHeadAttention


def linear_flops_per_token(*modules: nn.Module) -> int:
    """2 x in x out summed over every ``nn.Linear`` inside ``modules``: forward FLOPs for one token."""
    return sum(
        2 * layer.in_features * layer.out_features
        for module in modules
        for layer in module.modules()
        if isinstance(layer, nn.Linear)
    )


def attention_width(attention: MultiHeadAttention) -> int:
    """Heads x head dimension: the width over which scores and contexts are computed."""
    return attention.num_heads * attention.head_dim


def transformer_forward_flops(model: nn.Module, src_lengths: Tensor, tgt_lengths: Tensor) -> int:
    """Forward FLOPs of ``model`` (a :class:`~app.models.transformer.Transformer`) on a batch of pairs.

    ``src_lengths`` and ``tgt_lengths`` (B,) are the real token counts of each pair (source + EOS,
    BOS + target), as :func:`batch_lengths` returns them.
    """
    s = src_lengths.to("cpu", torch.float64)  # counted on the host, wherever the batch lives
    t = tgt_lengths.to("cpu", torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    for layer in model.encoder:
        width = attention_width(layer.self_attn)
        total += s.sum() * linear_flops_per_token(layer.self_attn, layer.ffn) + 4 * width * (s * s).sum()
    for layer in model.decoder:
        self_width, cross_width = attention_width(layer.self_attn), attention_width(layer.cross_attn)
        per_target = linear_flops_per_token(
            layer.self_attn, layer.cross_attn.q_proj, layer.cross_attn.out_proj, layer.ffn
        )
        per_source = linear_flops_per_token(layer.cross_attn.k_proj, layer.cross_attn.v_proj)
        total += t.sum() * per_target + s.sum() * per_source
        total += 4 * self_width * (t * (t + 1) / 2).sum() + 4 * cross_width * (t * s).sum()
    total += t.sum() * linear_flops_per_token(model.output)
    return int(total)


def transformer_training_flops(model: nn.Module, src_lengths: Tensor, tgt_lengths: Tensor) -> int:
    """FLOPs of one training step on the batch: forward + backward = 3 x forward."""
    return 3 * transformer_forward_flops(model, src_lengths, tgt_lengths)


def batch_lengths(src: Tensor, tgt_out: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Real lengths (B,) of the padded ``src`` (ids + EOS) and ``tgt_out`` (ids + EOS) of a batch.

    The decoder reads BOS + ids, as long as ``tgt_out``, so ``tgt_out``'s length is the target length.
    """
    return src.ne(pad_id).sum(dim=1), tgt_out.ne(pad_id).sum(dim=1)


def supports_flop_count(model: nn.Module) -> bool:
    """True for models whose FLOPs :func:`transformer_forward_flops` can count (the Transformer)."""
    return all(hasattr(model, name) for name in ("encoder", "decoder", "output")) and all(
        isinstance(getattr(layer, "self_attn", None), MultiHeadAttention) for layer in model.encoder
    )
