"""Transformer encoder-decoder (Vaswani et al. 2017), pre-LN by default (Xiong et al. 2020).

Attention at every site (encoder self, decoder causal self, cross) is built from the ``attention``
config through :mod:`app.attention.factory`, so attention variants plug in without touching this file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from app.attention import AttentionCache, KVCache, MultiHeadAttention, StaticCache, build_kernel, padding_mask
from app.attention.factory import AttentionSpec, build_attention
from app.attention.packing import PackedRows
from app.models.dropout import Dropout
from app.models.embeddings import SinusoidalPositions, TokenEmbedding
from app.models.packed import PackedForward
from app.models.seq2seq import DecoderState, EncoderOutput, Seq2Seq

# The feed-forward activation: ReLU (the paper), swish = SiLU x * sigmoid(x) (Ramachandran et al. 2017;
# Marian's OPUS-MT models), GELU (Hendrycks & Gimpel 2016, exact erf form).
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "swish": nn.SiLU, "gelu": nn.GELU}


class FeedForward(nn.Sequential):
    """Position-wise FFN, section 3.3: Linear -> activation (ReLU) -> (dropout) -> Linear.

    The paper applies dropout only to sublayer outputs; ``dropout`` here is the optional extra one on
    the inner activations, off by default (a 4x wider tensor, and random masks are costly on CPU).
    """

    def __init__(self, *, d_model: int, d_ff: int, dropout: float, activation: str = "relu") -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid choices: {', '.join(ACTIVATIONS)}")
        inner = Dropout(dropout) if dropout > 0 else nn.Identity()  # same parameter names either way
        act = ACTIVATIONS[activation]()
        super().__init__(nn.Linear(d_model, d_ff), act, inner, nn.Linear(d_ff, d_model))


class Residual(nn.Module):
    """A residual connection with layer norm before (pre-LN) or after (post-LN) the sublayer."""

    def __init__(self, *, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        activation_dropout: float,
        pre_norm: bool,
        self_attn: AttentionSpec,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.self_attn = build_attention(self_attn, site="encoder_self", d_model=d_model, num_heads=num_heads)
        self.ffn = FeedForward(d_model=d_model, d_ff=d_ff, dropout=activation_dropout, activation=activation)
        self.attn_block = Residual(d_model=d_model, dropout=dropout, pre_norm=pre_norm)
        self.ffn_block = Residual(d_model=d_model, dropout=dropout, pre_norm=pre_norm)

    def forward(self, x: Tensor, mask: Tensor, packed: PackedRows | None = None) -> Tensor:
        """``x`` (B, S, D) with ``mask`` (B, S); with ``packed``, (N, D): only the real rows (see
        :meth:`Transformer.encode`)."""
        x = self.attn_block(x, lambda h: self.self_attn(h, key_mask=mask, packed=packed)[0])
        return self.ffn_block(x, self.ffn)


@dataclass
class LayerCache:
    """A decoder layer's caches, each of the kind its kernel keeps (``AttentionKernel.new_cache``)."""

    self_attn: AttentionCache = field(default_factory=KVCache)
    cross_attn: StaticCache = field(default_factory=StaticCache)


class DecoderLayer(nn.Module):
    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float,
        activation_dropout: float,
        pre_norm: bool,
        self_attn: AttentionSpec,
        activation: str = "relu",
        cross_attn: AttentionSpec,
    ) -> None:
        super().__init__()
        self.self_attn = build_attention(self_attn, site="decoder_self", d_model=d_model, num_heads=num_heads)
        self.cross_attn = build_attention(cross_attn, site="cross", d_model=d_model, num_heads=num_heads)
        self.ffn = FeedForward(d_model=d_model, d_ff=d_ff, dropout=activation_dropout, activation=activation)
        self.self_block = Residual(d_model=d_model, dropout=dropout, pre_norm=pre_norm)
        self.cross_block = Residual(d_model=d_model, dropout=dropout, pre_norm=pre_norm)
        self.ffn_block = Residual(d_model=d_model, dropout=dropout, pre_norm=pre_norm)
        self.last_cross_weights: Tensor | None = None

    def forward(
        self,
        y: Tensor,
        memory: Tensor,
        memory_mask: Tensor,
        cache: LayerCache | None = None,
        need_weights: bool = False,
        group: int = 1,
    ) -> Tensor:
        """``y`` (B*G, T, D) target states, G rows per sentence of ``memory`` (B, S, D) and ``memory_mask``
        (B, S) (beam search's beams, see :meth:`MultiHeadAttention.forward`); with a cache, T is the new
        step(s) only."""
        self_cache = cache.self_attn if cache else None
        cross_cache = cache.cross_attn if cache else None
        y = self.self_block(y, lambda h: self.self_attn(h, causal=True, cache=self_cache)[0])

        def cross(h: Tensor) -> Tensor:
            out, self.last_cross_weights = self.cross_attn(
                h,
                memory=memory,
                key_mask=memory_mask,
                cache=cross_cache,
                need_weights=need_weights,
                group=group,
            )
            return out

        y = self.cross_block(y, cross)
        return self.ffn_block(y, self.ffn)


def check_index(index: int | None, size: int, what: str) -> int:
    """``index`` in [-size, size) as a non-negative index (None = the last); a bad one names the range."""
    if index is None:
        return size - 1
    if not -size <= index < size:
        raise ValueError(f"{what} {index} does not exist: the model has {size} (0 .. {size - 1})")
    return index % size


@contextmanager
def weights_kernel(attention: MultiHeadAttention) -> Iterator[None]:
    """Let ``attention`` return its weights: swap an exact kernel without them for the eager reference."""
    kernel = attention.kernel
    caps = kernel.capabilities
    if caps.returns_weights:
        yield
        return
    if not caps.exact:
        raise ValueError(f"the {type(kernel).__name__} kernel approximates attention: it has no weights")
    attention.kernel = build_kernel("eager")
    try:
        yield
    finally:
        attention.kernel = kernel


@dataclass
class TransformerState(DecoderState):
    memory: Tensor  # (B, S, D), one row per sentence
    memory_mask: Tensor  # (B, S)
    caches: list[LayerCache]
    step: int = 0
    group: int = 1  # decoder rows per sentence (beam search's K), consecutive: B*G rows in all

    def reorder(self, index: Tensor) -> None:
        # Cross-attention keys/values depend on the sentence only, and beam search keeps rows within a
        # sentence's group, so only the growing self-attention caches are reordered.
        for cache in self.caches:
            cache.self_attn.reorder(index)

    def select_rows(self, index: Tensor) -> None:
        # Whole sentences leave together: ``index`` keeps G consecutive rows of each sentence kept.
        sentences = index[:: self.group] // self.group  # (b',)
        self.memory = self.memory.index_select(0, sentences)
        self.memory_mask = self.memory_mask.index_select(0, sentences)
        for cache in self.caches:
            cache.self_attn.select(index, sentences)
            cache.cross_attn.select(index, sentences)


class Transformer(PackedForward, Seq2Seq):
    """Encoder-decoder Transformer with optional (two- or three-way) tied embeddings; it also trains on
    packed batches (:mod:`app.models.packed`).

    The defaults are this toolkit's own models; ``activation``, ``positions``, ``scale_embeddings`` and
    ``output_bias`` let other Transformers be rebuilt exactly (Marian's OPUS-MT models: swish, sines then
    cosines, a bias on the logits; see ``conf/model/marian.yaml``).
    """

    def __init__(
        self,
        *,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        attention: dict[str, AttentionSpec],
        d_model: int = 512,
        num_heads: int = 8,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        activation_dropout: float = 0.0,
        pre_norm: bool = True,
        tie_embeddings: bool = True,
        share_src_tgt_embeddings: bool = False,
        max_positions: int = 256,
        activation: str = "relu",
        positions: str = "interleaved",
        scale_embeddings: bool = True,
        output_bias: bool = False,
    ) -> None:
        super().__init__()
        self.pad_id, self.max_positions = pad_id, max_positions
        layer = {
            "d_model": d_model,
            "num_heads": num_heads,
            "d_ff": d_ff,
            "dropout": dropout,
            "activation_dropout": activation_dropout,
            "pre_norm": pre_norm,
            "activation": activation,
        }
        embed = {"d_model": d_model, "pad_id": pad_id, "scale": scale_embeddings}
        self.src_embed = TokenEmbedding(vocab_size=src_vocab_size, **embed)
        if share_src_tgt_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError(
                    f"share_src_tgt_embeddings needs one joint vocabulary, got {src_vocab_size} source and "
                    f"{tgt_vocab_size} target entries"
                )
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = TokenEmbedding(vocab_size=tgt_vocab_size, **embed)
        self.positions = SinusoidalPositions(d_model=d_model, max_len=max_positions, layout=positions)
        self.embed_dropout = Dropout(dropout)
        self.encoder = nn.ModuleList(
            EncoderLayer(**layer, self_attn=attention["encoder_self"]) for _ in range(encoder_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(**layer, self_attn=attention["decoder_self"], cross_attn=attention["cross"])
            for _ in range(decoder_layers)
        )
        stacks = ((self.encoder, "self_attn"), (self.decoder, "self_attn"), (self.decoder, "cross_attn"))
        for layers, site in stacks:  # e.g. Linformer's layerwise sharing: one projection for the whole stack
            for later in layers[1:]:
                getattr(later, site).kernel.tie_to(getattr(layers[0], site).kernel)
        # Pre-LN stacks need a final norm; post-LN outputs are already normalised.
        self.encoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=output_bias)  # Marian's final_logits_bias
        if output_bias:
            nn.init.zeros_(self.output.bias)
        if tie_embeddings:
            self.output.weight = self.tgt_embed.weight  # Press & Wolf 2017
        else:
            nn.init.normal_(self.output.weight, std=d_model**-0.5)

    pack_padding = True  # the encoder skips padded rows where it can (see :meth:`encode`)

    def embed(self, tokens: Tensor, embedding: TokenEmbedding, offset: int = 0) -> Tensor:
        return self.embed_dropout(self.positions(embedding(tokens), offset))

    def encode(self, src: Tensor) -> EncoderOutput:
        """The encoder's output (B, S, D) for ``src`` (B, S).

        Without gradients (translation, validation) a padded batch runs its position-wise work over the
        real rows only (:mod:`app.attention.packing`); its memory is zeros at the padding, which every reader
        masks. Training keeps the padded layout, so its arithmetic and random draws are unchanged.
        """
        mask = padding_mask(src, self.pad_id)  # (B, S)
        packed = None
        if self.pack_padding and not torch.is_grad_enabled() and not bool(mask.all()):
            packed = PackedRows.of(mask)
        return self.encode_rows(src, mask, packed)

    def encode_rows(self, src: Tensor, mask: Tensor, packed: PackedRows | None) -> EncoderOutput:
        """The encoder over ``src`` (B, S) with its ``mask`` (B, S), position-wise work over the rows
        ``packed`` where given (N of the B*S), else over the padded layout."""
        x = self.embed(src, self.src_embed)
        if packed is not None:
            x = packed.pack(x)  # (N, D)
        for layer in self.encoder:
            x = layer(x, mask, packed)
        memory = self.encoder_norm(x)
        return EncoderOutput(memory=memory if packed is None else packed.unpack(memory), mask=mask)

    def decode_features(self, tgt_in: Tensor, encoded: EncoderOutput) -> Tensor:
        """Final decoder states (B, T, D) for the whole target prefix at once, before the output layer."""
        y = self.embed(tgt_in, self.tgt_embed)
        for layer in self.decoder:
            y = layer(y, encoded.memory, encoded.mask)
        return self.decoder_norm(y)

    def decode(self, tgt_in: Tensor, encoded: EncoderOutput) -> Tensor:
        """Logits (B, T, V) for the whole target prefix at once (training, scoring)."""
        return self.output(self.decode_features(tgt_in, encoded))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.decode(tgt_in, self.encode(src))

    def output_features(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, nn.Linear]:
        return self.decode_features(tgt_in, self.encode(src)), self.output

    def start_decoding(self, encoded: EncoderOutput) -> TransformerState:
        caches = [
            LayerCache(
                self_attn=layer.self_attn.kernel.new_cache(cross=False),
                cross_attn=layer.cross_attn.kernel.new_cache(cross=True),
            )
            for layer in self.decoder
        ]
        return TransformerState(memory=encoded.memory, memory_mask=encoded.mask, caches=caches)

    def start_beams(self, encoded: EncoderOutput, beams: int) -> TransformerState:
        """``beams`` rows per sentence that share its encoder output and cross-attention keys/values
        (computed once per sentence, not per beam) where the kernel ``shares_keys``."""
        state = self.start_decoding(encoded)
        state.group = beams
        return state

    widens_beams = True

    def widen_beams(self, state: TransformerState, beams: int) -> None:
        """Each row's self-attention caches repeated ``beams`` times (held back until the next step's append,
        see :class:`KVCache`); cross-attention caches shared by a sentence's beams where the kernel
        ``shares_keys``, repeated otherwise (:class:`StaticCache`): the layout :meth:`start_beams` gives."""
        rows = torch.arange(state.memory.size(0), device=state.memory.device).repeat_interleave(beams)
        for cache in state.caches:
            cache.self_attn.reorder(rows)
            cache.cross_attn.reorder(rows)
        state.group = beams

    def decode_step(self, tokens: Tensor, state: TransformerState, need_weights: bool = False) -> Tensor:
        """Log-probabilities (B, V) of the next token after ``tokens`` (B,), one cached step: embeddings,
        every decoder layer, output layer and log-softmax; ``state`` moves one position on."""
        y = self.embed(tokens[:, None], self.tgt_embed, offset=state.step)  # (B, 1, D)
        for layer, cache in zip(self.decoder, state.caches, strict=True):
            y = layer(
                y, state.memory, state.memory_mask, cache=cache, need_weights=need_weights, group=state.group
            )
        state.step += 1
        logits = self.output(self.decoder_norm(y[:, 0]))  # (B, V)
        return F.log_softmax(logits.float(), dim=-1)

    def cross_attention(
        self, src: Tensor, tgt_in: Tensor, *, layer: int | None = None, head: int | None = None
    ) -> Tensor:
        """Cross-attention weights (B, T, S) of decoder ``layer`` (None = last), one ``head`` or their mean.

        Exact kernels that do not return weights (sdpa, flash) are replaced by the eager reference
        for this one call, which computes the same attention; approximations (linear) have no weights.
        """
        index = check_index(layer, len(self.decoder), "attention layer")
        encoded = self.encode(src)
        y = self.embed(tgt_in, self.tgt_embed)
        for i, decoder_layer in enumerate(self.decoder[: index + 1]):
            with weights_kernel(decoder_layer.cross_attn) if i == index else nullcontext():
                y = decoder_layer(y, encoded.memory, encoded.mask, need_weights=i == index)
        weights = self.decoder[index].last_cross_weights  # (B, H, T, S)
        self.decoder[index].last_cross_weights = None
        if head is None:
            return weights.mean(dim=1)
        return weights[:, check_index(head, weights.size(1), "attention head")]

    @torch.no_grad()
    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
