"""Batched beam search with a GNMT length penalty (Wu et al. 2016, eq. 14), or Marian's |Y|^alpha.

All B x K hypotheses advance together through the model's ``decode_step``. At each step the 2K best
continuations of every sentence are ranked; those ending in EOS among the top K are finished, the K
best others continue. A sentence is done once it has K finished hypotheses (or reaches its length
limit, where only EOS is allowed). With K = 1 this is exactly greedy search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from app.decoding.candidates import top_candidates
from app.decoding.greedy import constrain
from app.decoding.hypothesis import Hypothesis
from app.models.seq2seq import DecoderState, EncoderOutput, Seq2Seq

MAX_LENGTH_PENALTY = 5.0  # alpha above this ranks by length alone (the server's bound too)
LENGTH_NORMS = ("gnmt", "power")


def length_penalty(length: Tensor | int, alpha: float, norm: str = "gnmt") -> Tensor | float:
    """What a finished hypothesis's summed log-probability is divided by: ``gnmt`` ((5 + |Y|) / 6) ** alpha
    (Wu et al. 2016, eq. 14), ``power`` |Y| ** alpha (Marian, Hugging Face, CTranslate2); |Y| counts EOS.
    alpha = 0 compares raw log-probabilities."""
    if norm == "power":
        return float(length) ** alpha if isinstance(length, int) else length**alpha
    if norm != "gnmt":
        raise ValueError(f"unknown length_norm {norm!r}; valid choices: {', '.join(LENGTH_NORMS)}")
    return ((5.0 + length) / 6.0) ** alpha


def check_length_penalty(alpha: float) -> None:
    """The one rule for alpha (translate.py, the server, every config's search settings): a finite number
    in [0, MAX_LENGTH_PENALTY]. NaN or infinity makes every score NaN (and ``--format jsonl`` no JSON); a
    negative alpha prefers ever longer outputs."""
    if not (math.isfinite(alpha) and 0.0 <= alpha <= MAX_LENGTH_PENALTY):
        raise ValueError(
            f"length penalty (alpha) must be a number in [0, {MAX_LENGTH_PENALTY:g}], got {alpha}"
        )


@dataclass
class Finished:
    """Completed hypotheses of one sentence."""

    hyps: list[Hypothesis] = field(default_factory=list)

    def best(self) -> list[int]:
        return self.nbest(1)[0].tokens

    def nbest(self, n: int) -> list[Hypothesis]:
        """The ``n`` best by score, best first (an empty hypothesis when none finished)."""
        ranked = sorted(self.hyps, key=lambda h: h.score, reverse=True)[:n]
        return ranked or [Hypothesis(tokens=[], score=float("-inf"))]


@dataclass
class Beams:
    """The live hypotheses of the sentences still being searched: K rows per sentence."""

    sentence: Tensor  # (b,) original batch position of each live sentence
    scores: Tensor  # (b, K) summed log-probabilities
    tokens: Tensor  # (b*K,) last token of each row
    history: Tensor  # (b*K, t) tokens so far, BOS excluded
    token_scores: Tensor  # (b*K, t) log-probability of each of those tokens
    limits: Tensor  # (b*K,) most output tokens per row

    @classmethod
    def start(cls, limits: Tensor, k: int, bos_id: int) -> Beams:
        batch, device = limits.size(0), limits.device
        scores = torch.full((batch, k), float("-inf"), device=device, dtype=torch.float32)  # also under bf16
        scores[:, 0] = 0.0  # all beams start identical: keep one alive
        return cls(
            sentence=torch.arange(batch, device=device),
            scores=scores,
            tokens=torch.full((batch * k,), bos_id, dtype=torch.long, device=device),
            history=torch.empty(batch * k, 0, dtype=torch.long, device=device),
            token_scores=torch.empty(batch * k, 0, device=device, dtype=torch.float32),
            limits=limits.repeat_interleave(k),
        )

    def advance(self, cand_scores: Tensor, cand_beam: Tensor, cand_token: Tensor, eos_id: int) -> Tensor:
        """Continue with the K best non-EOS candidates; returns each new row's parent row (b*K,)."""
        b, k = self.scores.shape
        keep = surviving_candidates(cand_token, eos_id, k)  # (b, K) positions among the 2K candidates
        new_scores = cand_scores.gather(1, keep)  # (b, K)
        parent = (cand_beam.gather(1, keep) + torch.arange(b, device=keep.device)[:, None] * k).view(-1)
        step_scores = new_scores.view(-1) - self.scores.view(-1)[parent]  # (b*K,) this token's log-prob
        self.scores = new_scores
        self.tokens = cand_token.gather(1, keep).view(-1)
        self.history = torch.cat([self.history.index_select(0, parent), self.tokens[:, None]], dim=1)
        self.token_scores = torch.cat(
            [self.token_scores.index_select(0, parent), step_scores[:, None]], dim=1
        )
        return parent

    def keep_sentences(self, live: Tensor) -> Tensor:
        """Drop the sentences where ``live`` (b,) is False; returns the kept rows (b'*K,)."""
        k = self.scores.size(1)
        rows = (live.nonzero() * k + torch.arange(k, device=live.device)).view(-1)
        self.sentence, self.scores = self.sentence[live], self.scores[live]
        self.tokens, self.history, self.limits = self.tokens[rows], self.history[rows], self.limits[rows]
        self.token_scores = self.token_scores[rows]
        return rows


@torch.inference_mode()
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
    length_norm: str = "gnmt",
) -> list[list[int]]:
    """Best hypothesis per sentence (ids without BOS/EOS). ``src`` (B, S); ``limits`` (B,) max tokens."""
    found = beam_hypotheses(
        model,
        src,
        beam_size=beam_size,
        bos_id=bos_id,
        eos_id=eos_id,
        limits=limits,
        alpha=alpha,
        banned=banned,
        length_norm=length_norm,
    )
    return [hyps[0].tokens for hyps in found]


@torch.inference_mode()
def beam_hypotheses(
    model: Seq2Seq,
    src: Tensor,
    *,
    beam_size: int,
    bos_id: int,
    eos_id: int,
    limits: Tensor,
    alpha: float = 0.6,
    banned: tuple[int, ...] = (),
    nbest: int = 1,
    length_norm: str = "gnmt",
) -> list[list[Hypothesis]]:
    """The ``nbest`` (<= ``beam_size``) best hypotheses per sentence, best first, with their scores
    (summed log-probabilities over :func:`length_penalty` of ``length_norm``).

    Sentences that have K finished hypotheses leave the batch, so the remaining steps cost less.
    """
    k = beam_size
    length_penalty(1, alpha, length_norm)  # an unknown norm fails before any work
    if not 1 <= nbest <= k:
        raise ValueError(f"nbest={nbest} must be between 1 and the beam size {k}")
    encoded = model.encode(src)
    beams = Beams.start(limits.to(src.device), k, bos_id)
    state, first = start_state(model, encoded, k, bos_id)
    finished = [Finished() for _ in range(src.size(0))]
    done = torch.zeros(src.size(0), dtype=torch.long, device=src.device)  # finished hypotheses per sentence
    limit_steps = frozenset(limits.tolist())  # every row's limit is one of these, however rows leave
    for step in range(int(limits.max())):
        if step == 0 and first is not None:  # one row per sentence (see start_state)
            log_probs, scores, row_limits = first_rows(first, beams)
        else:
            log_probs = model.decode_step(beams.tokens, state)
            scores, row_limits = beams.scores, beams.limits
        log_probs = constrain(log_probs, step, row_limits, eos_id, banned, limit_steps=limit_steps)
        cand_scores, cand_beam, cand_token = top_candidates(scores, log_probs, k)
        penalty = (alpha, length_norm)
        collect_finished(
            finished, done, beams, cand_scores, cand_beam, cand_token, log_probs, eos_id, penalty
        )
        live = done[beams.sentence] < k  # (b,)
        if not bool(live.any()):
            break
        state.reorder(beams.advance(cand_scores, cand_beam, cand_token, eos_id))
        if not bool(live.all()):
            state.select_rows(beams.keep_sentences(live))
    return [f.nbest(nbest) for f in finished]


def start_state(
    model: Seq2Seq, encoded: EncoderOutput, k: int, bos_id: int
) -> tuple[DecoderState, Tensor | None]:
    """The decoder state with K rows per sentence (B*K,), sentence by sentence, and the first step's
    log-probabilities (B, V), one row per sentence, where they are computed already (else None: the search
    computes them, K rows per sentence).

    All K beams of a sentence start from BOS with the same state, so where the model can widen a state
    (``widens_beams``) the first step decodes one row per sentence, then the state is widened: the first
    step costs a K-th of the work, and the outputs are the same. Its candidates are ranked from that one
    row too (the K copies would add only candidates of dead beams, scored -inf).
    """
    if k == 1 or not model.widens_beams:
        return model.start_beams(encoded, k), None
    state = model.start_decoding(encoded)
    bos = torch.full((encoded.memory.size(0),), bos_id, dtype=torch.long, device=encoded.memory.device)
    log_probs = model.decode_step(bos, state)  # (B, V)
    model.widen_beams(state, k)
    return state, log_probs


def first_rows(first: Tensor, beams: Beams) -> tuple[Tensor, Tensor, Tensor]:
    """The first step's log-probabilities, beam scores and length limits to rank, from ``first`` (B, V):
    one row per sentence, or the K copies where V < 2K (too few subwords for 2K candidates from one row)."""
    k = beams.scores.size(1)
    if first.size(1) >= 2 * k:
        return first, beams.scores[:, :1], beams.limits[::k]
    return first.repeat_interleave(k, dim=0), beams.scores, beams.limits


def surviving_candidates(cand_token: Tensor, eos_id: int, k: int) -> Tensor:
    """Positions (B, K) of the K best candidates that do not end in EOS, in rank order."""
    width = cand_token.size(1)
    rank = torch.arange(width, device=cand_token.device)[None, :]
    order_key = rank + width * (cand_token == eos_id)  # EOS candidates sort after all others
    return order_key.argsort(dim=1)[:, :k]


def collect_finished(
    finished: list[Finished],
    done: Tensor,
    beams: Beams,
    cand_scores: Tensor,
    cand_beam: Tensor,
    cand_token: Tensor,
    log_probs: Tensor,
    eos_id: int,
    penalty: tuple[float, str],
) -> None:
    """Move EOS candidates ranked within the top K into their sentence's finished list; ``penalty``:
    (alpha, length_norm) of :func:`length_penalty`.

    Only the (few) EOS candidates reach Python; ``done`` (B,) counts each sentence's finished ones.
    """
    k = beams.scores.size(1)
    ends = (cand_token[:, :k] == eos_id) & torch.isfinite(cand_scores[:, :k])
    if not bool(ends.any()):
        return
    length = beams.history.size(1) + 1  # tokens so far plus EOS
    divisor = length_penalty(length, *penalty)
    live_pos, pos = ends.nonzero(as_tuple=True)
    beam = cand_beam[live_pos, pos]
    parent = live_pos * k + beam  # (E,) rows of the beams that end here
    rows_per_sentence = log_probs.size(0) // beams.scores.size(0)  # K, or 1 on the first step
    eos_scores = log_probs[live_pos * rows_per_sentence + beam, eos_id]
    histories, token_scores = beams.history[parent].tolist(), beams.token_scores[parent].tolist()
    sentences, totals = beams.sentence[live_pos].tolist(), cand_scores[live_pos, pos].tolist()
    for sentence, total, tokens, scores, eos in zip(
        sentences, totals, histories, token_scores, eos_scores.tolist(), strict=True
    ):
        if len(finished[sentence].hyps) >= k:
            continue
        finished[sentence].hyps.append(Hypothesis(tokens, total / divisor, [*scores, eos]))
        done[sentence] += 1
