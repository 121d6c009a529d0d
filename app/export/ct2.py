"""Export a Transformer checkpoint to a self-contained CTranslate2 model directory.

The model is described through ctranslate2's Python spec API and every weight is mapped by name:

    ours                                        CTranslate2
    src_embed / tgt_embed (x sqrt(d_model))     embeddings, scale_embeddings (False where unscaled)
    positions.table (either layout)             position_encodings.encodings (set explicitly: CT2's
                                                built-in table puts all sines before all cosines)
    attn_block.norm / self_block.norm           self_attention.layer_norm / attention.layer_norm /
    cross_block.norm / ffn_block.norm           ffn.layer_norm, before each sublayer (pre-norm) or
                                                after each residual sum (post-norm, pre_norm=False)
    self_attn.{q,k,v}_proj                      self_attention.linear[0] (fused q|k|v rows)
    self_attn.out_proj                          self_attention.linear[1]
    cross_attn.q_proj / {k,v}_proj / out_proj   attention.linear[0] / linear[1] (fused k|v) / linear[2]
    ffn.0 / ffn.3                               ffn.linear_0 / ffn.linear_1 (ReLU, swish or GELU)
    encoder_norm / decoder_norm (pre-LN only)   encoder.layer_norm / decoder.layer_norm
    output (+ its bias, if any)                 decoder.projection (the embedding when tied)

Beside CTranslate2's files the directory keeps both sentencepiece models and ``attn_mt.json`` (model
limits and the source checkpoint), so ``translate.py DIR`` needs nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from app.attention.multihead import MultiHeadAttention
from app.checkpoint import LoadedModel, load_model
from app.data.multilingual import Languages
from app.data.tokenizer import Tokenizer
from app.models.transformer import ACTIVATIONS, DecoderLayer, EncoderLayer, Transformer

QUANTIZATIONS = ("float32", "bfloat16", "float16", "int16", "int8", "int8_float32", "int8_bfloat16")
METADATA_FILE = "attn_mt.json"
SRC_SPM, TGT_SPM = "source.spm.model", "target.spm.model"
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which every norm of our models keeps
EXACT_KERNELS = ("eager", "sdpa", "flash")  # full softmax attention, which CTranslate2 computes


class ExportError(ValueError):
    """A model that CTranslate2 cannot represent, or bad export settings."""


def is_ct2_model_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by :func:`export_ct2`."""
    path = Path(path)
    return path.is_dir() and (path / "model.bin").is_file() and (path / METADATA_FILE).is_file()


def export_ct2(
    checkpoint: str | os.PathLike[str], output_dir: str | os.PathLike[str], *, quantization: str = "float32"
) -> Path:
    """Write the CTranslate2 model of ``checkpoint`` to ``output_dir`` (created; must not hold a model)."""
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    loaded = load_model(checkpoint)
    return save_ct2(loaded, output_dir, quantization=quantization, source=str(checkpoint))


def save_ct2(
    loaded: LoadedModel, output_dir: str | os.PathLike[str], *, quantization: str, source: str = ""
) -> Path:
    """Save a loaded model, its tokenizers and metadata as a CTranslate2 directory; returns it."""
    spec = transformer_spec(loaded.model, loaded.src_tokenizer, loaded.tgt_tokenizer)
    output = Path(output_dir)
    if output.exists() and any(output.iterdir()):
        raise ExportError(f"{output} exists and is not empty; choose a new directory")
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=f".{output.name}.") as tmp:
        tmp_dir = Path(tmp) / "model"
        spec.validate()
        spec.optimize(quantization=quantization)
        tmp_dir.mkdir()
        spec.save(str(tmp_dir))
        (tmp_dir / SRC_SPM).write_bytes(loaded.src_tokenizer.to_bytes())
        (tmp_dir / TGT_SPM).write_bytes(loaded.tgt_tokenizer.to_bytes())
        metadata = {
            "format": "attn-mt ct2 export 1",
            "source_checkpoint": source,
            "quantization": quantization,
            "max_positions": loaded.model.max_positions,
            # a multilingual model's directions; its target tags are source tokens (no target_prefix)
            "directions": list(Languages.from_config(loaded.config).directions),
            "config": loaded.config,
        }
        (tmp_dir / METADATA_FILE).write_text(json.dumps(metadata, indent=2, default=str) + "\n")
        if output.exists():
            output.rmdir()
        shutil.move(str(tmp_dir), output)  # all files appear together: no half-written model
    return output


def check_exportable(model: nn.Module) -> None:
    """Stop with the variant's name and what CTranslate2 lacks when the model cannot be represented."""
    if not isinstance(model, Transformer):
        raise ExportError(
            f"{type(model).__name__} cannot be exported to CTranslate2: it runs Transformer encoder-decoders "
            "only, with no recurrent (RNN/LSTM) seq2seq models"
        )
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            kernel = type(module.kernel).__name__
            caps = module.kernel.capabilities
            if not caps.exact or caps.recurrent:
                raise ExportError(
                    f"{name} uses the {kernel} attention kernel, which CTranslate2 lacks: it computes full "
                    f"softmax attention only ({', '.join(EXACT_KERNELS)} kernels), no sparse or linear "
                    "attention"
                )
    activation = type(model.encoder[0].ffn[1])
    if activation not in ACTIVATIONS.values():
        raise ExportError(f"the feed-forward activation {activation.__name__} has no CTranslate2 counterpart")
    self_kv = {layer.self_attn.num_kv_heads for layer in model.decoder}
    cross_kv = {layer.cross_attn.num_kv_heads for layer in model.decoder}
    if len(self_kv | cross_kv) > 1:
        raise ExportError(
            f"decoder key/value heads differ between sites (self {sorted(self_kv)}, "
            f"cross {sorted(cross_kv)}): CTranslate2 has one num_heads_kv per decoder"
        )
    if len({layer.self_attn.num_kv_heads for layer in model.encoder}) > 1:
        raise ExportError("encoder layers have different key/value head counts: CTranslate2 needs one")


def transformer_spec(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer) -> Any:
    """The ``ctranslate2.specs.TransformerSpec`` of ``model`` with every weight and vocabulary set."""
    from ctranslate2.specs import TransformerDecoderSpec, TransformerEncoderSpec, TransformerSpec

    check_exportable(model)
    first_enc, first_dec = model.encoder[0], model.decoder[0]
    pre_norm = first_enc.attn_block.pre_norm
    heads = first_enc.self_attn.num_heads
    shape = {"pre_norm": pre_norm, "activation": ct2_activation(type(first_enc.ffn[1]))}
    encoder = TransformerEncoderSpec(
        len(model.encoder), heads, num_heads_kv=kv_heads(first_enc.self_attn), **shape
    )
    decoder = TransformerDecoderSpec(
        len(model.decoder), heads, num_heads_kv=kv_heads(first_dec.self_attn), **shape
    )
    set_embeddings(encoder, model.src_embed, model.positions.table)
    set_embeddings(decoder, model.tgt_embed, model.positions.table)
    for layer_spec, layer in zip(encoder.layer, model.encoder, strict=True):
        set_encoder_layer(layer_spec, layer)
    for layer_spec, layer in zip(decoder.layer, model.decoder, strict=True):
        set_decoder_layer(layer_spec, layer)
    if pre_norm:
        set_layer_norm(encoder.layer_norm, model.encoder_norm)
        set_layer_norm(decoder.layer_norm, model.decoder_norm)
    decoder.projection.weight = array(model.output.weight)
    if model.output.bias is not None:  # Marian's final_logits_bias
        decoder.projection.bias = array(model.output.bias)
    spec = TransformerSpec(encoder, decoder)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPSILON
    spec.config.decoder_start_token = tgt_tok.id_to_piece([tgt_tok.bos_id])[0]
    spec.config.add_source_eos = False  # the engines append EOS themselves, as the torch model expects
    spec.register_source_vocabulary(vocabulary(src_tok))
    spec.register_target_vocabulary(vocabulary(tgt_tok))
    return spec


def kv_heads(attention: MultiHeadAttention) -> int | None:
    """CTranslate2's num_heads_kv: None for MHA (its default), else the key/value head count."""
    return None if attention.num_kv_heads == attention.num_heads else attention.num_kv_heads


def vocabulary(tokenizer: Tokenizer) -> list[str]:
    """Pieces in id order: CTranslate2 maps tokens to ids by position in this list."""
    return tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))


def array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def ct2_activation(activation: type[nn.Module]) -> Any:
    """CTranslate2's activation for one of ours (:data:`app.models.transformer.ACTIVATIONS`)."""
    from ctranslate2.specs.common_spec import Activation

    return {nn.ReLU: Activation.RELU, nn.SiLU: Activation.SWISH, nn.GELU: Activation.GELU}[activation]


def set_embeddings(spec: Any, embedding: nn.Embedding, positions: torch.Tensor) -> None:
    embeddings = spec.embeddings if isinstance(spec.embeddings, list) else [spec.embeddings]
    embeddings[0].weight = array(embedding.weight)  # the encoder spec: a list (source features); we have one
    spec.scale_embeddings = embedding.scale != 1.0  # TokenEmbedding multiplies by sqrt(d_model), or not
    spec.position_encodings.encodings = array(positions)  # (max_positions, D)


def set_layer_norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = array(norm.weight), array(norm.bias)


def set_linear(spec: Any, *linears: nn.Linear) -> None:
    """One CTranslate2 linear from one or several of ours, fused along the output rows."""
    spec.weight = np.concatenate([array(linear.weight) for linear in linears])
    spec.bias = np.concatenate([array(linear.bias) for linear in linears])


def set_ffn(spec: Any, layer: EncoderLayer | DecoderLayer) -> None:
    set_layer_norm(spec.layer_norm, layer.ffn_block.norm)
    set_linear(spec.linear_0, layer.ffn[0])
    set_linear(spec.linear_1, layer.ffn[3])


def set_encoder_layer(spec: Any, layer: EncoderLayer) -> None:
    attn = layer.self_attn
    set_layer_norm(spec.self_attention.layer_norm, layer.attn_block.norm)
    set_linear(spec.self_attention.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
    set_linear(spec.self_attention.linear[1], attn.out_proj)
    set_ffn(spec.ffn, layer)


def set_decoder_layer(spec: Any, layer: DecoderLayer) -> None:
    self_attn, cross = layer.self_attn, layer.cross_attn
    set_layer_norm(spec.self_attention.layer_norm, layer.self_block.norm)
    set_linear(spec.self_attention.linear[0], self_attn.q_proj, self_attn.k_proj, self_attn.v_proj)
    set_linear(spec.self_attention.linear[1], self_attn.out_proj)
    set_layer_norm(spec.attention.layer_norm, layer.cross_block.norm)
    set_linear(spec.attention.linear[0], cross.q_proj)
    set_linear(spec.attention.linear[1], cross.k_proj, cross.v_proj)
    set_linear(spec.attention.linear[2], cross.out_proj)
    set_ffn(spec.ffn, layer)
