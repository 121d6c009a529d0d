"""The Transformer's teacher-forced forward pass over a packed batch: no padding anywhere.

Why: in a padded (B, S) batch every matrix product (projections, feed-forward layers, the output layer over
the vocabulary and the loss) also runs over the B*S - N padding positions, and attention needs a dense mask.
A packed batch (:mod:`app.attention.segments`) holds only the N real tokens as (N, D) rows: embeddings take
each token's own position (restarting at every sequence), every position-wise layer runs over the N rows, and
attention goes through :meth:`MultiHeadAttention.forward_packed`, whose kernels see each sequence's own keys.
Training and validation loss only; decoding keeps the padded, cached path.
"""

from __future__ import annotations

from torch import Tensor, nn

from app.attention.segments import Segments


def encoder_layer(layer: nn.Module, x: Tensor, segments: Segments) -> Tensor:
    """One :class:`~app.models.transformer.EncoderLayer` over packed source rows ``x`` (Ns, D)."""
    x = layer.attn_block(x, lambda h: layer.self_attn.forward_packed(h, segments))
    return layer.ffn_block(x, layer.ffn)


def decoder_layer(
    layer: nn.Module, y: Tensor, segments: Segments, memory: Tensor, memory_segments: Segments
) -> Tensor:
    """One :class:`~app.models.transformer.DecoderLayer` over packed target rows ``y`` (Nt, D): causal
    within each target, attending to its own source's rows of ``memory`` (Ns, D)."""
    y = layer.self_block(y, lambda h: layer.self_attn.forward_packed(h, segments, causal=True))
    y = layer.cross_block(
        y,
        lambda h: layer.cross_attn.forward_packed(
            h, segments, memory=memory, memory_segments=memory_segments
        ),
    )
    return layer.ffn_block(y, layer.ffn)


class PackedForward:
    """The packed forward pass of :class:`~app.models.transformer.Transformer` (a mixin: it reads the
    model's embeddings, positions, layers, norms and output layer)."""

    packs_batches = True

    def embed_packed(self, tokens: Tensor, embedding: nn.Embedding, segments: Segments) -> Tensor:
        """(N, D): ``tokens`` (N,) embedded at their positions within their own sequences."""
        x = self.positions.at(embedding(tokens), segments.positions, segments.longest)
        return self.embed_dropout(x)

    def encode_packed(self, src: Tensor, segments: Segments) -> Tensor:
        """The encoder's output (Ns, D) for packed sources ``src`` (Ns,)."""
        x = self.embed_packed(src, self.src_embed, segments)
        for layer in self.encoder:
            x = encoder_layer(layer, x, segments)
        return self.encoder_norm(x)

    def packed_output_features(
        self, src: Tensor, src_segments: Segments, tgt_in: Tensor, tgt_segments: Segments
    ) -> tuple[Tensor, nn.Linear]:
        """The final decoder states (Nt, D) of packed target inputs ``tgt_in`` (Nt,) given packed sources
        ``src`` (Ns,), and the output layer that turns them into logits (Nt, V)."""
        memory = self.encode_packed(src, src_segments)
        y = self.embed_packed(tgt_in, self.tgt_embed, tgt_segments)
        for layer in self.decoder:
            y = decoder_layer(layer, y, tgt_segments, memory, src_segments)
        return self.decoder_norm(y), self.output

    def forward_packed(
        self, src: Tensor, src_segments: Segments, tgt_in: Tensor, tgt_segments: Segments
    ) -> Tensor:
        """Logits (Nt, V) of the packed targets: one row per real target token, none for padding."""
        features, output = self.packed_output_features(src, src_segments, tgt_in, tgt_segments)
        return output(features)
