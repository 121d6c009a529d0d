"""Batched greedy decoding with the model's incremental state (KV caches)."""

from __future__ import annotations

import torch
from torch import Tensor

from app.models.seq2seq import Seq2Seq


@torch.no_grad()
def greedy_search(
    model: Seq2Seq, src: Tensor, *, bos_id: int, eos_id: int, limits: Tensor, banned: tuple[int, ...] = ()
) -> list[list[int]]:
    """Most likely next token at every step; returns each sentence's ids without BOS/EOS.

    ``src`` (B, S) padded source ids; ``limits`` (B,) the most tokens (EOS included) per sentence;
    ``banned`` ids (padding, BOS) are never produced.
    """
    batch = src.size(0)
    state = model.start_decoding(model.encode(src))
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    steps: list[Tensor] = []
    for step in range(int(limits.max())):
        log_probs = constrain(model.decode_step(tokens, state), step, limits, eos_id, banned)  # (B, V)
        tokens = log_probs.argmax(dim=-1)
        tokens = tokens.masked_fill(finished, eos_id)
        steps.append(tokens)
        finished |= tokens == eos_id
        if bool(finished.all()):
            break
    return [strip_after_eos(row, eos_id) for row in torch.stack(steps, dim=1).tolist()]


def constrain(log_probs: Tensor, step: int, limits: Tensor, eos_id: int, banned: tuple[int, ...]) -> Tensor:
    """Rule out ``banned`` ids; rows whose output reaches its length limit at ``step`` may only choose EOS.

    Works in place on ``log_probs`` (B, V), a fresh tensor from ``decode_step``. A forced EOS keeps the
    model's log-probability, so beam search scores a hypothesis cut at its limit like any other
    (a free EOS would favour hypotheses the model did not want to end).
    """
    at_limit = (limits.to(log_probs.device) == step + 1).nonzero().squeeze(1)  # rows that must end now
    eos = log_probs[at_limit, eos_id].clone()
    if banned:
        log_probs[:, list(banned)] = float("-inf")
    if at_limit.numel():
        log_probs[at_limit] = float("-inf")
        log_probs[at_limit, eos_id] = eos
    return log_probs


def strip_after_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids
