"""Batched greedy decoding with the model's incremental state (KV caches)."""

from __future__ import annotations

import torch
from torch import Tensor

from app.decoding.hypothesis import Hypothesis
from app.models.seq2seq import Seq2Seq


@torch.inference_mode()
def greedy_search(
    model: Seq2Seq, src: Tensor, *, bos_id: int, eos_id: int, limits: Tensor, banned: tuple[int, ...] = ()
) -> list[list[int]]:
    """Most likely next token at every step; returns each sentence's ids without BOS/EOS.

    ``src`` (B, S) padded source ids; ``limits`` (B,) the most tokens (EOS included) per sentence;
    ``banned`` ids (padding, BOS) are never produced.
    """
    hyps = greedy_hypotheses(model, src, bos_id=bos_id, eos_id=eos_id, limits=limits, banned=banned)
    return [h.tokens for h in hyps]


@torch.inference_mode()
def greedy_hypotheses(
    model: Seq2Seq, src: Tensor, *, bos_id: int, eos_id: int, limits: Tensor, banned: tuple[int, ...] = ()
) -> list[Hypothesis]:
    """:func:`greedy_search` with the log-probability of every chosen token (EOS included)."""
    return token_search(
        model,
        src,
        bos_id=bos_id,
        eos_id=eos_id,
        limits=limits,
        banned=banned,
        choose=lambda lp: lp.argmax(-1),
    )


def token_search(
    model: Seq2Seq,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    limits: Tensor,
    banned: tuple[int, ...],
    choose,
) -> list[Hypothesis]:
    """One hypothesis per sentence, built token by token with ``choose(log_probs (b, V)) -> ids (b,)``.

    Greedy search chooses the argmax, sampling draws from the distribution. A sentence leaves the batch
    at its EOS: its rows of the decoder state are dropped (``select_rows``), so each step decodes only the
    unfinished sentences, not every row up to the longest output (at batch 64 on Multi30k that was ~1.8x
    the rows needed).
    """
    batch, device = src.size(0), src.device
    state = model.start_decoding(model.encode(src))
    limits = limits.to(device)
    steps = int(limits.max())
    ids = torch.full((batch, steps), eos_id, dtype=torch.long, device=device)  # after EOS: EOS, score 0
    scores = torch.zeros(batch, steps, device=device, dtype=torch.float32)  # also under a bf16 default dtype
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=device)
    live, live_limits = torch.arange(batch, device=device), limits  # (b,) the decoded rows' sentences
    limit_steps = frozenset(limits.tolist())
    done = 0
    for step in range(steps):
        log_probs = model.decode_step(tokens, state)  # (b, V)
        log_probs = constrain(log_probs, step, live_limits, eos_id, banned, limit_steps=limit_steps)
        tokens = choose(log_probs)
        ids[live, step] = tokens
        scores[live, step] = log_probs.gather(1, tokens[:, None])[:, 0].float()
        done = step + 1
        going = tokens != eos_id
        if not bool(going.all()):
            if not bool(going.any()):
                break
            kept = going.nonzero().squeeze(1)
            state.select_rows(kept)
            live, live_limits, tokens = live[kept], live_limits[kept], tokens[kept]
    rows, row_scores = ids[:, :done].tolist(), scores[:, :done].tolist()  # (B, T)
    return [hypothesis(r, s, eos_id) for r, s in zip(rows, row_scores, strict=True)]


def hypothesis(ids: list[int], scores: list[float], eos_id: int) -> Hypothesis:
    """The output up to EOS, with the scores of its tokens and of EOS when it was produced."""
    end = ids.index(eos_id) + 1 if eos_id in ids else len(ids)
    kept = scores[:end]
    return Hypothesis(tokens=strip_after_eos(ids, eos_id), score=float(sum(kept)), token_scores=kept)


def constrain(
    log_probs: Tensor,
    step: int,
    limits: Tensor,
    eos_id: int,
    banned: tuple[int, ...],
    *,
    limit_steps: frozenset[int] | None = None,
) -> Tensor:
    """Rule out ``banned`` ids; rows whose output reaches its length limit at ``step`` may only choose EOS.

    Works in place on ``log_probs`` (B, V), a fresh tensor from ``decode_step``. A forced EOS keeps the
    model's log-probability, so beam search scores a hypothesis cut at its limit like any other
    (a free EOS would favour hypotheses the model did not want to end). ``limit_steps``, the values
    ``limits`` can hold (read once per search), skips looking for rows at their limit on the steps where
    none can be: that search is five tensor operations, a fair share of a batch-1 step's host-side work.
    """
    may_end = limit_steps is None or step + 1 in limit_steps
    if may_end:
        at_limit = (limits.to(log_probs.device) == step + 1).nonzero().squeeze(1)  # rows that must end now
        eos = log_probs[at_limit, eos_id].clone()
    for banned_id in banned:  # one column each: cheaper than indexing with a list, made into a tensor
        log_probs[:, banned_id] = float("-inf")
    if may_end and at_limit.numel():
        log_probs[at_limit] = float("-inf")
        log_probs[at_limit, eos_id] = eos
    return log_probs


def strip_after_eos(ids: list[int], eos_id: int) -> list[int]:
    return ids[: ids.index(eos_id)] if eos_id in ids else ids
