"""Attentional RNN decoders: Bahdanau (2015) and Luong (2015), one step at a time.

Training (teacher forcing) and search call the same :meth:`RNNDecoder.step`, so incremental decoding
is the full forward by construction. Per sentence, the mechanism's key projections are computed once
(:meth:`RNNDecoder.start`); a step then costs one embedding lookup, one recurrent cell per layer, one
(B, S) attention row and the output projection.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from app.attention.mechanisms import AttentionMechanism, MechanismOutput
from app.models.dropout import Dropout
from app.models.seq2seq import DecoderState

CellState = tuple[Tensor, ...]  # (h,) for a GRU layer, (h, c) for an LSTM layer; each (B, H)


class StackedCell(nn.Module):
    """``num_layers`` GRU or LSTM cells with dropout between layers; one time step per call."""

    CELLS: ClassVar[dict[str, type[nn.RNNCellBase]]] = {"gru": nn.GRUCell, "lstm": nn.LSTMCell}

    def __init__(
        self, *, cell: str, input_size: int, hidden_size: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__()
        if cell not in self.CELLS:
            raise ValueError(f"unknown RNN cell {cell!r}; valid choices: {', '.join(sorted(self.CELLS))}")
        if num_layers < 1:
            raise ValueError(f"decoder_layers must be >= 1, got {num_layers}")
        sizes = [input_size] + [hidden_size] * (num_layers - 1)
        self.cells = nn.ModuleList(self.CELLS[cell](size, hidden_size) for size in sizes)
        self.is_lstm = cell == "lstm"
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, states: list[CellState]) -> tuple[Tensor, list[CellState]]:
        """Input ``x`` (B, In) and per-layer states; returns the top layer's output (B, H) and new states."""
        new_states: list[CellState] = []
        for index, (cell, state) in enumerate(zip(self.cells, states, strict=True)):
            if index:
                x = self.dropout(x)
            out = cell(x, state if self.is_lstm else state[0])
            new_state = tuple(out) if self.is_lstm else (out,)
            new_states.append(new_state)
            x = new_state[0]
        return x, new_states


@dataclass
class RNNState(DecoderState):
    """Recurrent state of a batch of hypotheses plus their sentence's encoder outputs."""

    layers: list[CellState]  # per decoder layer, (B, H) tensors
    feed: Tensor | None  # Luong input feeding: the previous attentional vector (B, E); else None
    memory: Tensor  # (B, S, 2He) encoder outputs
    keys: Tensor  # (B, S, Dk) the mechanism's precomputed key projections
    mask: Tensor  # (B, S) True at real source tokens

    def reorder(self, index: Tensor) -> None:
        self.layers = [tuple(t.index_select(0, index) for t in layer) for layer in self.layers]
        if self.feed is not None:
            self.feed = self.feed.index_select(0, index)

    def select_rows(self, index: Tensor) -> None:
        self.reorder(index)
        self.memory = self.memory.index_select(0, index)
        self.keys = self.keys.index_select(0, index)
        self.mask = self.mask.index_select(0, index)


class RNNDecoder(nn.Module, ABC):
    """What both decoders share: the stacked cell, attention, the pre-output layer and dropout.

    ``output_size`` is the width of the vector handed to the output layer (the embedding size, so the
    output projection can share the target embedding matrix).
    """

    # Attention-config keys this decoder takes itself; the others go to the mechanism.
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        *,
        attention: AttentionMechanism,
        cell: str,
        embedding_size: int,
        hidden_size: int,
        memory_size: int,
        num_layers: int,
        dropout: float,
        rnn_input_size: int,
        pre_output_input_size: int,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.hidden_size, self.output_size = hidden_size, embedding_size
        self.rnn = StackedCell(
            cell=cell,
            input_size=rnn_input_size,
            hidden_size=hidden_size,
            num_layers=num_layers,
            dropout=dropout,
        )
        self.pre_output = nn.Linear(pre_output_input_size, embedding_size)
        self.dropout = Dropout(dropout)

    def start(self, memory: Tensor, mask: Tensor, layers: list[CellState]) -> RNNState:
        """State before the first target token: precomputed keys, the bridged initial states."""
        return RNNState(
            layers=layers,
            feed=None,
            memory=memory,
            keys=self.attention.project_keys(memory),
            mask=mask,
        )

    def attend(self, query: Tensor, state: RNNState) -> MechanismOutput:
        return self.attention(query, state.keys, state.memory, state.mask)

    @abstractmethod
    def step(self, embedded: Tensor, state: RNNState) -> tuple[Tensor, Tensor]:
        """One target position from the previous token's embedding (B, E); updates ``state``.

        Returns the vector for the output layer (B, E) and the attention weights (B, S).
        """


class BahdanauDecoder(RNNDecoder):
    """Bahdanau et al. 2015, appendix A.2.2: the context c_t is computed from the previous state s_{t-1}.

    c_t = attend(s_{t-1}, h)      s_t = RNN([E y_{t-1}; c_t], s_{t-1})
    o_t = tanh(W_o [s_t; c_t; E y_{t-1}])     (the paper's deep output, tanh instead of maxout)
    """

    def __init__(
        self,
        *,
        attention: AttentionMechanism,
        cell: str,
        embedding_size: int,
        hidden_size: int,
        memory_size: int,
        num_layers: int,
        dropout: float,
    ) -> None:
        super().__init__(
            attention=attention,
            cell=cell,
            embedding_size=embedding_size,
            hidden_size=hidden_size,
            memory_size=memory_size,
            num_layers=num_layers,
            dropout=dropout,
            rnn_input_size=embedding_size + memory_size,  # [E y_{t-1}; c_t]
            pre_output_input_size=hidden_size + memory_size + embedding_size,  # [s_t; c_t; E y_{t-1}]
        )

    def step(self, embedded: Tensor, state: RNNState) -> tuple[Tensor, Tensor]:
        attended = self.attend(state.layers[-1][0], state)  # query: top layer's s_{t-1}
        top, state.layers = self.rnn(torch.cat([embedded, attended.context], dim=-1), state.layers)
        features = torch.cat([self.dropout(top), attended.context, embedded], dim=-1)  # (B, H + 2He + E)
        return self.pre_output(features).tanh(), attended.weights


class LuongDecoder(RNNDecoder):
    """Luong et al. 2015, section 3: attention from the current state s_t, then an attentional state.

    s_t = RNN([E y_{t-1}; h~_{t-1}], s_{t-1})   (input feeding, section 3.3; E y_{t-1} alone without)
    c_t = attend(s_t, h)        h~_t = tanh(W_c [c_t; s_t])   (eq. 5)
    """

    options: ClassVar[tuple[str, ...]] = ("input_feeding",)

    def __init__(
        self,
        *,
        attention: AttentionMechanism,
        cell: str,
        embedding_size: int,
        hidden_size: int,
        memory_size: int,
        num_layers: int,
        dropout: float,
        input_feeding: bool = True,
    ) -> None:
        super().__init__(
            attention=attention,
            cell=cell,
            embedding_size=embedding_size,
            hidden_size=hidden_size,
            memory_size=memory_size,
            num_layers=num_layers,
            dropout=dropout,
            rnn_input_size=embedding_size * (2 if input_feeding else 1),  # [E y_{t-1}; h~_{t-1}]
            pre_output_input_size=memory_size + hidden_size,  # [c_t; s_t]
        )
        self.input_feeding = input_feeding

    def start(self, memory: Tensor, mask: Tensor, layers: list[CellState]) -> RNNState:
        state = super().start(memory, mask, layers)
        if self.input_feeding:  # h~_0 = 0
            state.feed = memory.new_zeros(memory.size(0), self.output_size)
        return state

    def step(self, embedded: Tensor, state: RNNState) -> tuple[Tensor, Tensor]:
        rnn_input = torch.cat([embedded, state.feed], dim=-1) if self.input_feeding else embedded
        top, state.layers = self.rnn(rnn_input, state.layers)
        attended = self.attend(top, state)
        output = self.pre_output(torch.cat([attended.context, self.dropout(top)], dim=-1)).tanh()  # h~_t
        if self.input_feeding:
            state.feed = output
        return output, attended.weights


DECODERS: dict[str, type[RNNDecoder]] = {"bahdanau": BahdanauDecoder, "luong": LuongDecoder}
