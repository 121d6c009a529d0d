"""Batched beam search with a GNMT length penalty (Wu et al. 2016, eq. 14).

All B x K hypotheses advance together through the model's ``decode_step``. At each step the 2K best
continuations of every sentence are ranked; those ending in EOS among the top K are finished, the K
best others continue. A sentence is done once it has K finished hypotheses (or reaches its length
limit, where only EOS is allowed). With K = 1 this is exactly greedy search.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from app.decoding.greedy import constrain
from app.models.seq2seq import EncoderOutput, Seq2Seq


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """((5 + |Y|) / 6) ** alpha; alpha = 0 compares raw log-probabilities."""
    return ((5.0 + length) / 6.0) ** alpha


@dataclass
class Finished:
    """Completed hypotheses of one sentence."""

    hyps: list[tuple[float, list[int]]] = field(default_factory=list)

    def best(self) -> list[int]:
        return max(self.hyps, key=lambda h: h[0])[1] if self.hyps else []


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    *,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    limits: Tensor,
    alpha: float = 0.6,
    banned: tuple[int, ...] = (),
) -> list[list[int]]:
    """Best hypothesis per sentence (ids without BOS/EOS). ``src`` (B, S); ``limits`` (B,) max tokens."""
    batch, k = src.size(0), beam_size
    encoded = model.encode(src)
    rows = torch.arange(batch, device=src.device).repeat_interleave(k)  # (B*K,) sentence of each row
    state = model.start_decoding(EncoderOutput(memory=encoded.memory[rows], mask=encoded.mask[rows]))
    row_limits = limits.to(src.device)[rows]
    scores = torch.full((batch, k), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # all beams start identical: keep one alive
    history = torch.empty(batch * k, 0, dtype=torch.long, device=src.device)
    tokens = torch.full((batch * k,), bos_id, dtype=torch.long, device=src.device)
    finished = [Finished() for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool)
    for step in range(int(limits.max())):
        log_probs = constrain(model.decode_step(tokens, state), step, row_limits, eos_id, banned)
        cand_scores, cand_beam, cand_token = top_candidates(scores, log_probs, k)
        collect_finished(finished, done, cand_scores, cand_beam, cand_token, history, step, k, eos_id, alpha)
        done |= torch.tensor([len(f.hyps) >= k for f in finished])
        if bool(done.all()):
            break
        keep = surviving_candidates(cand_token, eos_id, k)  # (B, K) positions among the 2K candidates
        scores = cand_scores.gather(1, keep)
        parent = (cand_beam.gather(1, keep) + torch.arange(batch, device=src.device)[:, None] * k).view(-1)
        tokens = cand_token.gather(1, keep).view(-1)
        history = torch.cat([history.index_select(0, parent), tokens[:, None]], dim=1)
        state.reorder(parent)
    return [f.best() for f in finished]


def top_candidates(scores: Tensor, log_probs: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The 2K best continuations per sentence: (scores, source beam, token), each (B, 2K)."""
    batch = scores.size(0)
    vocab = log_probs.size(-1)
    total = scores[:, :, None] + log_probs.view(batch, k, vocab)  # (B, K, V)
    cand_scores, flat = total.view(batch, -1).topk(min(2 * k, k * vocab), dim=1)
    return cand_scores, flat // vocab, flat % vocab


def surviving_candidates(cand_token: Tensor, eos_id: int, k: int) -> Tensor:
    """Positions (B, K) of the K best candidates that do not end in EOS, in rank order."""
    width = cand_token.size(1)
    rank = torch.arange(width, device=cand_token.device)[None, :]
    order_key = rank + width * (cand_token == eos_id)  # EOS candidates sort after all others
    return order_key.argsort(dim=1)[:, :k]


def collect_finished(
    finished: list[Finished],
    done: Tensor,
    cand_scores: Tensor,
    cand_beam: Tensor,
    cand_token: Tensor,
    history: Tensor,
    step: int,
    k: int,
    eos_id: int,
    alpha: float,
) -> None:
    """Move EOS candidates ranked within the top K of unfinished sentences into ``finished``."""
    ends = (cand_token[:, :k] == eos_id) & torch.isfinite(cand_scores[:, :k])
    for sent, pos in ends.nonzero().tolist():
        if done[sent] or len(finished[sent].hyps) >= k:
            continue
        row = sent * k + int(cand_beam[sent, pos])
        score = float(cand_scores[sent, pos]) / length_penalty(step + 1, alpha)
        finished[sent].hyps.append((score, history[row].tolist()))
