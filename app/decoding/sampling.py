"""Random sampling from the model's distribution: top-k (Fan et al. 2018) or nucleus / top-p
(Holtzman et al. 2020), with a temperature. A seeded generator makes the draws reproducible."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from app.decoding.greedy import token_search
from app.decoding.hypothesis import Hypothesis
from app.models.seq2seq import Seq2Seq

MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0  # outside: softmax of log-probs / T over- or underflows


@dataclass(frozen=True)
class Sampling:
    """``top_k`` > 0 keeps the k likeliest tokens; ``top_p`` < 1 keeps the smallest set whose probability
    reaches p; ``temperature`` divides the log-probabilities before either; ``seed`` fixes the draws."""

    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        temperature_ok = (
            math.isfinite(self.temperature) and MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE
        )
        if self.top_k < 0 or not 0.0 < self.top_p <= 1.0 or not temperature_ok:
            raise ValueError(
                f"sampling needs top_k >= 0 (got {self.top_k}), 0 < top_p <= 1 (got {self.top_p}) and "
                f"a temperature in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}] (got {self.temperature})"
            )

    @classmethod
    def parse(cls, text: str, *, temperature: float = 1.0, seed: int = 0) -> Sampling:
        """``topk:K`` or ``topp:P`` (the ``--sample`` option) as settings; a bad spec names the forms."""
        kind, _, value = text.partition(":")
        if kind not in ("topk", "topp"):
            raise ValueError(
                f"bad sampling spec {text!r}: use topk:K (e.g. topk:10) or topp:P (e.g. topp:0.9)"
            )
        try:
            limit = {"top_k": int(value)} if kind == "topk" else {"top_p": float(value)}
        except ValueError as err:
            raise ValueError(f"bad sampling spec {text!r}: {err}") from err
        return cls(**limit, temperature=temperature, seed=seed)  # out-of-range values: named by the checks


def filter_logits(log_probs: Tensor, sampling: Sampling) -> Tensor:
    """Tempered log-probabilities (B, V) with every token outside top-k / top-p set to -inf."""
    logits = log_probs / sampling.temperature
    if sampling.top_k > 0:
        kth = logits.topk(min(sampling.top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        drop_sorted = before >= sampling.top_p  # the first token is always kept
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
    return logits


@torch.inference_mode()
def sample_search(
    model: Seq2Seq,
    src: Tensor,
    sampling: Sampling,
    *,
    bos_id: int,
    eos_id: int,
    limits: Tensor,
    banned: tuple[int, ...] = (),
    generator: torch.Generator | None = None,
) -> list[Hypothesis]:
    """One sampled output per sentence; scores are the model's (untempered) log-probabilities."""
    if generator is None:
        generator = torch.Generator(device=src.device).manual_seed(sampling.seed)

    def draw(log_probs: Tensor) -> Tensor:
        probs = filter_logits(log_probs, sampling).softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    return token_search(model, src, bos_id=bos_id, eos_id=eos_id, limits=limits, banned=banned, choose=draw)
