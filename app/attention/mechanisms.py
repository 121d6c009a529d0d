"""Attention mechanisms of RNN decoders: one interface, a registry, a masked softmax.

A *mechanism* scores one decoder state against every encoder state of its sentence (Bahdanau et al.
2015, Luong et al. 2015). It is a different axis from the Transformer's *kernels*
(:mod:`app.attention.registry`): kernels compute softmax(QK^T)V for already projected heads, mechanisms
own their score function and projections. Shapes:

    query (B, Dq)      memory (B, S, Dm)      mask (B, S), True at real source tokens

The work that depends only on the source (key projections) is done once per sentence by
:meth:`AttentionMechanism.precompute`, so each decoder step costs one small projection of the query
plus a (B, S) score row.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from app.attention.registry import AttentionConfigError


@dataclass
class MechanismOutput:
    """What one attention step returns."""

    context: Tensor  # (B, Dm) weighted sum of the memory
    weights: Tensor  # (B, S) attention distribution over source positions; exactly 0 at padding


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last dimension where ``mask`` (broadcastable, True = real) holds; 0 elsewhere.

    Masked scores are replaced before the softmax (no -inf arithmetic, so no NaN gradients) and the
    weights are multiplied by the mask afterwards, so padding gets exactly zero weight. A row without
    any real position is all zeros.
    """
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * mask


class AttentionMechanism(nn.Module):
    """Base class: ``precompute`` once per sentence, then ``forward`` once per decoder step.

    Subclasses implement :meth:`project_keys` (source-only work) and :meth:`score`.
    ``query_size`` is the decoder state size, ``memory_size`` the encoder output size.
    """

    name: ClassVar[str] = ""  # the registered name, set by :func:`register_mechanism`

    @classmethod
    def describe(cls, options: Mapping[str, Any]) -> str:
        """A short label of the score function and the options set, e.g. ``additive attention_size=128``.

        A class method: the sizes a mechanism is built with come from the model, not from the attention
        config this describes.
        """
        return " ".join(
            [cls.name, *(f"{key}={value}" for key, value in options.items() if value is not None)]
        )

    def __init__(self, *, query_size: int, memory_size: int) -> None:
        super().__init__()
        self.query_size, self.memory_size = query_size, memory_size

    def project_keys(self, memory: Tensor) -> Tensor:
        """Keys (B, S, Dk) of ``memory`` (B, S, Dm), computed once per sentence."""
        return memory

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """Unnormalised scores (B, S) of ``query`` (B, Dq) against ``keys`` (B, S, Dk)."""
        raise NotImplementedError

    def forward(self, query: Tensor, keys: Tensor, memory: Tensor, mask: Tensor) -> MechanismOutput:
        """Attend from ``query`` (B, Dq) over ``memory`` (B, S, Dm) with precomputed ``keys``."""
        weights = masked_softmax(self.score(query, keys), mask)  # (B, S)
        context = torch.bmm(weights.unsqueeze(1), memory).squeeze(1)  # (B, Dm)
        return MechanismOutput(context=context, weights=weights)


_MECHANISMS: dict[str, type[AttentionMechanism]] = {}


def register_mechanism(name: str) -> Callable[[type[AttentionMechanism]], type[AttentionMechanism]]:
    """Class decorator: make a mechanism selectable as ``attention.mechanism=<name>``."""

    def add(cls: type[AttentionMechanism]) -> type[AttentionMechanism]:
        if name in _MECHANISMS:
            raise ValueError(f"attention mechanism {name!r} is registered twice")
        cls.name = name
        _MECHANISMS[name] = cls
        return cls

    return add


def available_mechanisms() -> list[str]:
    """The registered score functions: the values of ``attention.mechanism`` for RNN models."""
    return sorted(_MECHANISMS)


def mechanism_class(name: str) -> type[AttentionMechanism]:
    """The class registered as ``name``; an unknown name is reported with the valid ones."""
    if name not in _MECHANISMS:
        raise AttentionConfigError(
            f"unknown RNN attention mechanism {name!r}; valid choices: {', '.join(available_mechanisms())}"
        )
    return _MECHANISMS[name]


def mechanism_options(name: str) -> list[str]:
    """The option names a mechanism's constructor takes besides the sizes the model gives it."""
    params = inspect.signature(mechanism_class(name).__init__).parameters.values()
    given = {"self", "query_size", "memory_size"}
    return [p.name for p in params if p.name not in given and p.kind is inspect.Parameter.KEYWORD_ONLY]


def build_mechanism(name: str, *, query_size: int, memory_size: int, **options: Any) -> AttentionMechanism:
    """Instantiate a registered mechanism; an unknown name or option is reported with the valid ones."""
    cls = mechanism_class(name)
    try:
        return cls(query_size=query_size, memory_size=memory_size, **options)
    except TypeError as err:
        raise AttentionConfigError(f"attention mechanism {name!r} rejected options {options}: {err}") from err
