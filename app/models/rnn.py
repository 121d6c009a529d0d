"""RNN encoder-decoder with attention (Bahdanau et al. 2015; Luong et al. 2015): model family ``rnn``.

A bidirectional GRU/LSTM encoder reads packed sequences (padding costs nothing and never leaks into
the backward direction); a bridge turns its final states into the decoder's initial state; the
decoder (:mod:`app.models.rnn_decoder`) is picked by ``attention.decoder`` and its score function by
``attention.mechanism``. The model offers the same encode / start_decoding / decode_step interface as
the Transformer, so greedy and beam search work unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from app.attention import padding_mask
from app.attention.config import RNNAttentionSpec
from app.attention.mechanisms import build_mechanism, mechanism_options
from app.attention.registry import AttentionConfigError
from app.models.dropout import Dropout
from app.models.embeddings import TokenEmbedding
from app.models.rnn_decoder import DECODERS, CellState, RNNDecoder, RNNState
from app.models.seq2seq import EncoderOutput, Seq2Seq

RNN_CLASSES: dict[str, type[nn.RNNBase]] = {"gru": nn.GRU, "lstm": nn.LSTM}


class RNNEncoder(nn.Module):
    """Bidirectional multi-layer GRU/LSTM over packed sequences; outputs [forward; backward] states."""

    def __init__(
        self, *, cell: str, input_size: int, hidden_size: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__()
        if cell not in RNN_CLASSES:
            raise ValueError(f"unknown RNN cell {cell!r}; valid choices: {', '.join(sorted(RNN_CLASSES))}")
        self.hidden_size = hidden_size
        self.rnn = RNN_CLASSES[cell](
            input_size,
            hidden_size,
            num_layers=num_layers,
            dropout=dropout if num_layers > 1 else 0.0,  # between layers only
            batch_first=True,
            bidirectional=True,
        )

    def forward(self, embedded: Tensor, mask: Tensor) -> Tensor:
        """``embedded`` (B, S, E), ``mask`` (B, S), real tokens first; returns (B, S, 2H), 0 at padding."""
        lengths = mask.sum(dim=1).clamp(min=1).cpu()
        packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        output, _ = self.rnn(packed)
        memory, _ = pad_packed_sequence(output, batch_first=True, total_length=embedded.size(1))
        return memory  # (B, S, 2H)


class Bridge(nn.Module):
    """Initial decoder state from the encoder's final states: tanh(W [h_fwd(last); h_bwd(first)]).

    Both final states are read from the encoder outputs (the forward direction at the last real
    token, the backward one at the first), so the bridge needs nothing beyond ``EncoderOutput`` and
    search code that copies only memory and mask keeps working. Bahdanau et al. 2015 (A.2.2) start
    from the backward state alone; Luong et al. 2015 from the encoder's last state.
    """

    def __init__(self, *, encoder_hidden_size: int, hidden_size: int, num_layers: int, is_lstm: bool) -> None:
        super().__init__()
        self.num_layers, self.hidden_size = num_layers, hidden_size
        self.parts = 2 if is_lstm else 1  # LSTM layers start with (h, c)
        self.proj = nn.Linear(2 * encoder_hidden_size, num_layers * self.parts * hidden_size)

    def forward(self, memory: Tensor, mask: Tensor) -> list[CellState]:
        """``memory`` (B, S, 2He), ``mask`` (B, S); returns per decoder layer a tuple of (B, H) tensors."""
        half = memory.size(-1) // 2
        last = (mask.sum(dim=1) - 1).clamp(min=0)  # (B,) index of each row's last real token
        rows = torch.arange(memory.size(0), device=memory.device)
        final = torch.cat([memory[rows, last, :half], memory[:, 0, half:]], dim=-1)  # (B, 2He)
        states = self.proj(final).tanh().view(-1, self.num_layers, self.parts, self.hidden_size)
        return [
            tuple(states[:, layer, part] for part in range(self.parts)) for layer in range(self.num_layers)
        ]


class RNNSeq2Seq(Seq2Seq):
    """Embeddings, bidirectional encoder, bridge, attentional decoder and (optionally tied) output layer."""

    def __init__(
        self,
        *,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int,
        attention: RNNAttentionSpec,
        cell: str = "lstm",
        embedding_size: int = 256,
        encoder_hidden_size: int = 256,
        decoder_hidden_size: int = 256,
        encoder_layers: int = 1,
        decoder_layers: int = 1,
        dropout: float = 0.2,
        tie_embeddings: bool = True,
        share_src_tgt_embeddings: bool = True,
        max_positions: int = 256,
    ) -> None:
        super().__init__()
        self.pad_id, self.max_positions = pad_id, max_positions
        self.src_embed, self.tgt_embed = self._embeddings(
            src_vocab_size, tgt_vocab_size, embedding_size, share_src_tgt_embeddings
        )
        self.dropout = Dropout(dropout)
        self.encoder = RNNEncoder(
            cell=cell,
            input_size=embedding_size,
            hidden_size=encoder_hidden_size,
            num_layers=encoder_layers,
            dropout=dropout,
        )
        self.bridge = Bridge(
            encoder_hidden_size=encoder_hidden_size,
            hidden_size=decoder_hidden_size,
            num_layers=decoder_layers,
            is_lstm=cell == "lstm",
        )
        memory_size = 2 * encoder_hidden_size
        self.decoder = decoder_class(attention)(
            attention=build_mechanism(
                attention.mechanism,
                query_size=decoder_hidden_size,
                memory_size=memory_size,
                **attention.mechanism_options,
            ),
            cell=cell,
            embedding_size=embedding_size,
            hidden_size=decoder_hidden_size,
            memory_size=memory_size,
            num_layers=decoder_layers,
            dropout=dropout,
            **attention.decoder_options,
        )
        self.output = nn.Linear(embedding_size, tgt_vocab_size)
        if tie_embeddings:
            self.output.weight = self.tgt_embed.weight  # Press & Wolf 2017

    def _embeddings(
        self, src_vocab: int, tgt_vocab: int, size: int, shared: bool
    ) -> tuple[TokenEmbedding, TokenEmbedding]:
        src = TokenEmbedding(vocab_size=src_vocab, d_model=size, pad_id=self.pad_id)
        if not shared:
            return src, TokenEmbedding(vocab_size=tgt_vocab, d_model=size, pad_id=self.pad_id)
        if src_vocab != tgt_vocab:
            raise ValueError(
                f"share_src_tgt_embeddings needs one joint vocabulary, got {src_vocab} source and "
                f"{tgt_vocab} target entries"
            )
        return src, src

    def encode(self, src: Tensor) -> EncoderOutput:
        mask = padding_mask(src, self.pad_id)  # (B, S)
        memory = self.encoder(self.dropout(self.src_embed(src)), mask)
        return EncoderOutput(memory=memory, mask=mask)

    def start_decoding(self, encoded: EncoderOutput) -> RNNState:
        initial = self.bridge(encoded.memory, encoded.mask)
        return self.decoder.start(encoded.memory, encoded.mask, initial)

    def decode_step(self, tokens: Tensor, state: RNNState) -> Tensor:
        output, _ = self.decoder.step(self.dropout(self.tgt_embed(tokens)), state)  # (B, E)
        return F.log_softmax(self.output(self.dropout(output)).float(), dim=-1)

    def run_decoder(self, tgt_in: Tensor, encoded: EncoderOutput) -> tuple[Tensor, Tensor]:
        """Teacher forcing: attentional outputs (B, T, E) and attention weights (B, T, S)."""
        state = self.start_decoding(encoded)
        embedded = self.dropout(self.tgt_embed(tgt_in))  # (B, T, E), one lookup for all steps
        outputs, weights = [], []
        for t in range(tgt_in.size(1)):
            output, step_weights = self.decoder.step(embedded[:, t], state)
            outputs.append(output)
            weights.append(step_weights)
        return torch.stack(outputs, dim=1), torch.stack(weights, dim=1)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        features, output = self.output_features(src, tgt_in)
        return output(features)  # (B, T, V)

    def output_features(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, nn.Linear]:
        outputs, _ = self.run_decoder(tgt_in, self.encode(src))
        return self.dropout(outputs), self.output  # (B, T, E)

    def cross_attention(
        self, src: Tensor, tgt_in: Tensor, *, layer: int | None = None, head: int | None = None
    ) -> Tensor:
        """Attention weights (B, T, S) of each target position over the source (teacher forcing).

        An RNN decoder has one attention with one head: ``layer`` and ``head`` must be None, 0 or -1.
        """
        for name, value in (("layer", layer), ("head", head)):
            if value not in (None, 0, -1):
                raise ValueError(f"the rnn model has a single attention with one head; got {name}={value}")
        return self.run_decoder(tgt_in, self.encode(src))[1]

    @torch.no_grad()
    def num_parameters(self) -> int:
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


def decoder_class(attention: RNNAttentionSpec) -> type[RNNDecoder]:
    """The decoder ``attention.decoder`` names, after checking that it takes the remaining options."""
    if attention.decoder not in DECODERS:
        raise AttentionConfigError(
            f"unknown RNN decoder attention.decoder={attention.decoder!r}; "
            f"valid choices: {', '.join(DECODERS)}"
        )
    decoder = DECODERS[attention.decoder]
    unknown = sorted(set(attention.decoder_options) - set(decoder.options))
    if unknown:
        raise AttentionConfigError(
            f"unknown key(s) {unknown} in attention for decoder {attention.decoder!r} and mechanism "
            f"{attention.mechanism!r}; the decoder's options: {list(decoder.options) or 'none'}, the "
            f"mechanism's: {mechanism_options(attention.mechanism) or 'none'}"
        )
    return decoder
