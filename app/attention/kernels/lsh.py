"""LSH attention: queries attend only the keys that share their hash bucket (Kitaev et al. 2020, "Reformer").

Section 2 of the paper, paragraph by paragraph, and where this kernel follows or departs from it:

* *Locality sensitive hashing*: angular LSH by a random rotation R (d x b/2), h(x) = argmax([xR; -xR]),
  ``n_buckets`` = b buckets. Queries and keys are hashed by the same rotations, so a query and a key
  pointing the same way share a bucket. The rotations are drawn once from ``seed`` (fixed for a run, not
  redrawn per step), one per hashing round.
* *LSH attention*: sort by (bucket, position), chunk, attend within a chunk and the one before it, masking
  keys of other buckets. With ``shared_qk`` (the paper's form, the config's default) the keys are the
  unit-length queries, k_j = q_j / |q_j|, and the layer has no key projection: every token is one sorted
  item, query and key at once, and chunk c attends chunks c-1, c and, not causal, c+1. Without it Q and K
  come from separate projections, so queries and keys are sorted *together*, and each chunk of
  ``chunk_size`` sorted items attends a slab of the sorted keys around it (about 3x the work per round:
  half the rows are keys). In both forms what a query sees does not depend on the chunking: up to
  ``chunk_size`` keys of its own bucket that come before it in (bucket, position) order and, unless
  causal, up to ``chunk_size`` after it. Causal: only earlier-or-equal positions, i.e. the query's
  ``chunk_size`` most recent same-bucket keys -- a choice made from past keys only, so a cached decoding
  step sees exactly what the full pass saw (the paper's chunks would let later tokens' buckets move the
  chunk boundaries).
* *Multi-round LSH attention*: ``n_hashes`` rounds; each round's softmax over its own keys is weighted by
  exp(z_r - z), z_r its log-sum-exp and z that of all rounds, and a key found in N_ij rounds' buckets has
  log N_ij subtracted from its score, so the combination is the softmax over the union of the rounds' key
  sets wherever each round's window holds its whole bucket.
* *Causal masking for shared-QK attention*: a query does not attend its own position unless nothing else
  is visible (``exclude_self``; in the paper q_i . k_i would dominate under shared QK). Here the own key is
  always offered as that last resort, whatever its bucket; ``exclude_self=false`` lets it compete like any
  other key instead.

Padded keys go to a bucket of their own that no query has, so they take no place in any window and their
values never matter. With one bucket and a ``chunk_size`` covering all keys, the kernel is softmax
attention (with ``exclude_self=false``; with the self rule, softmax attention with the diagonal hidden).

Costs per round: about ``chunk_size`` x (2 causal, 3 otherwise) scores per sorted item, i.e. O(T x chunk)
instead of O(T^2); short inputs and decoding steps take the direct form (:meth:`LSHAttention._rounds_dense`,
one (Tq, Tk) mask per round), which defines the same result. ``recompute`` keeps no scores for the
backward pass (activation checkpointing per round; in the shared-QK form a FlashAttention-style backward
per block of chunks). Cross-attention is refused: a target query has no position among the source keys
(no "own key" to fall back to) and a query whose buckets hold no source key would attend nothing. No
attention matrix is formed, so no weights and no weight dropout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities, repeat_kv
from app.attention.cache import AttentionCache, CodedKVCache
from app.attention.kernels.lsh_ops import bucket_codes, masked_softmax_lse, safe_softmax, take
from app.attention.kernels.lsh_shared import SharedRounds
from app.attention.registry import AttentionConfigError, register_kernel

CROSS_REASON = (
    "LSH buckets relate positions of one sequence: a target query has no own key among the source keys to "
    "fall back to, and one whose buckets hold no source key would attend nothing"
)


@register_kernel("lsh")
class LSHAttention(AttentionKernel):
    """Reformer's multi-round LSH attention for separate queries and keys; see the module docstring."""

    capabilities = KernelCapabilities(
        padding_mask=True,
        causal=True,
        returns_weights=False,
        incremental=True,  # exact: a query's keys are chosen from past keys only (KV cache of all keys)
        exact=False,
        attention_dropout=False,
        across_sequences=False,
    )
    reasons: ClassVar[dict[str, str]] = {"across_sequences": CROSS_REASON}

    def __init__(
        self,
        *,
        n_buckets: int = 8,
        n_hashes: int = 4,
        chunk_size: int = 64,
        seed: int = 0,
        exclude_self: bool = True,
        recompute: bool = False,
        shared_qk: bool = False,
    ) -> None:
        super().__init__()
        for name, value in {"n_buckets": n_buckets, "n_hashes": n_hashes, "chunk_size": chunk_size}.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AttentionConfigError(f"lsh attention {name}={value!r} must be an integer >= 1")
        if n_buckets > 1 and n_buckets % 2:
            raise AttentionConfigError(
                f"lsh attention n_buckets={n_buckets} must be 1 or even (h(x) = argmax([xR; -xR]))"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise AttentionConfigError(f"lsh attention seed={seed!r} must be an integer")
        self.n_buckets, self.n_hashes, self.chunk_size, self.seed = n_buckets, n_hashes, chunk_size, seed
        # recompute: no scores kept for the backward pass (separate form: checkpointing per round; shared
        # QK: lsh_shared.LeanRound per block of chunks), for less training memory on long inputs.
        self.exclude_self, self.recompute = bool(exclude_self), bool(recompute)
        # shared_qk: the paper's form, keys are the unit-length queries (the layer has no key projection);
        # a token is one sorted item, query and key at once: a third of the separate form's cost per round.
        self.shared_qk = bool(shared_qk)
        self._rotations: dict[tuple[int, torch.device], Tensor] = {}
        self._num_heads = 1  # set by bind()

    def extra_repr(self) -> str:
        settings = ("n_buckets", "n_hashes", "chunk_size", "seed", "exclude_self", "recompute", "shared_qk")
        return ", ".join(f"{name}={getattr(self, name)}" for name in settings)

    def describe(self) -> str:
        """E.g. ``lsh buckets=8 hashes=4 chunk=64`` (``shared-qk`` appended in the paper's form)."""
        shared = " shared-qk" if self.shared_qk else ""
        return f"{self.name} buckets={self.n_buckets} hashes={self.n_hashes} chunk={self.chunk_size}{shared}"

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        """Each round scores a slab of 2-3 chunks per sorted item (queries and keys, or shared tokens)."""
        items = 3 if self.shared_qk else 6
        return 4 * self.n_hashes * min(length, items * self.chunk_size)

    def key_codes(self, k: Tensor) -> Tensor:
        """Each key's bucket in every round, (B, Hkv, T, R) int16: what a decoding cache keeps beside it."""
        return bucket_codes(self.buckets(k))

    def new_cache(self, *, cross: bool) -> AttentionCache:
        """Self-attention keeps each key's buckets beside it (:meth:`key_codes`); cross is refused."""
        return CodedKVCache() if not cross else super().new_cache(cross=cross)

    def shared_keys(self, q: Tensor) -> Tensor:
        """Shared-QK keys: the queries scaled to unit length, k_j = q_j / |q_j| (paper, section 2)."""
        if not self.shared_qk:
            return super().shared_keys(q)
        return q / q.norm(dim=-1, keepdim=True).clamp(min=torch.finfo(q.dtype).tiny)

    def cache_bytes(self, length: int, *, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Keys, values and the keys' buckets; shared-QK keys have one head per query head (values keep
        ``num_kv_heads``)."""
        key_heads = self._num_heads if self.shared_qk else num_kv_heads
        codes = key_heads * length * self.n_hashes * 2  # the keys' buckets, int16 (key_codes)
        return (key_heads + num_kv_heads) * length * head_dim * dtype.itemsize + codes

    def bind(self, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """Remember the query head count (the shared-QK cache holds that many key heads)."""
        self._num_heads = num_heads

    # --- hashing ----------------------------------------------------------------------------------------

    def rotations(self, dim: int, device: torch.device) -> Tensor:
        """(n_hashes, Dh, n_buckets / 2) float32 random rotations, drawn once per head width from ``seed``."""
        key = (dim, device)
        if key not in self._rotations:
            gen = torch.Generator().manual_seed(self.seed)
            shape = (self.n_hashes, dim, self.n_buckets // 2)
            self._rotations[key] = torch.randn(*shape, generator=gen, dtype=torch.float64).float().to(device)
        return self._rotations[key]

    def buckets(self, x: Tensor) -> Tensor:
        """(n_hashes, B, H, T) bucket of each vector of ``x`` (B, H, T, Dh) in every round."""
        if self.n_buckets == 1:
            return x.new_zeros(self.n_hashes, *x.shape[:3], dtype=torch.long)
        with torch.no_grad():
            rotated = torch.einsum("bhtd,rdn->rbhtn", x.float(), self.rotations(x.size(-1), x.device))
            # argmax([xR; -xR]) without forming it: the largest of xR, or the most negative one (second
            # half), the first half on a tie, as argmax picks the first maximum.
            top, top_at = rotated.max(dim=-1)
            low, low_at = rotated.min(dim=-1)
            return torch.where(top >= -low, top_at, low_at + self.n_buckets // 2)  # (R, B, H, T)

    # --- the kernel -------------------------------------------------------------------------------------

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_mask: Tensor | None = None,
        causal: bool = False,
        dropout_p: float = 0.0,
        need_weights: bool = False,
        key_codes: Tensor | None = None,
    ) -> AttentionOutput:
        """Attend ``q`` (B, H, Tq, Dh) over ``k``/``v`` (B, Hkv, Tk, Dh) within hash buckets; ``key_codes``
        (B, Hkv, Tk, R), the keys' buckets as :meth:`key_codes` gave them (a decoding cache's), saves
        hashing every key again."""
        if need_weights:
            raise ValueError("lsh attention cannot return attention weights (it forms no attention matrix)")
        if dropout_p > 0:
            raise ValueError("lsh attention cannot apply attention dropout (dropout_p must be 0)")
        heads, tq, dim = q.size(1), q.size(2), q.size(3)
        tk = k.size(2)
        if key_codes is None:
            kb = self.buckets(repeat_kv(k, heads))  # (R, B, H, Tk)
        else:
            kb = repeat_kv(key_codes.permute(0, 1, 3, 2), heads).permute(2, 0, 1, 3).long()  # (R, B, H, Tk)
        k, v = repeat_kv(k, heads), repeat_kv(v, heads)  # (B, H, Tk, Dh)
        # Shared QK: a query's bucket is its own key's (the same direction), taken from the key so that a
        # cached decoding step and the full pass agree even where rounding would break an argmax tie.
        qb = kb[..., tk - tq :] if self.shared_qk else self.buckets(q)  # (R, B, H, Tq)
        if key_mask is not None:  # padded keys in a bucket of their own, which no real query has
            kb = kb.masked_fill(~key_mask[None, :, None, :], self.n_buckets)
            if self.shared_qk:
                qb = kb[..., tk - tq :]  # padded tokens (ignored queries) keep to padded keys
        q = q / math.sqrt(dim)
        width = self.chunk_size * (2 if causal else 3)
        if tq * tk <= (tq + tk) * width:
            rounds = self._rounds_dense
        elif self.shared_qk and tq == tk:
            rounds = self._rounds_shared
        else:
            rounds = self._rounds_chunked
        z, out = rounds(q, k, v, qb, kb, causal=causal)  # (R, B, H, Tq), R x (B, H, Tq, Dv)
        return AttentionOutput(context=self._combine(z, out, q, k, v, key_mask=key_mask))

    def _combine(
        self, z: Tensor, out: Sequence[Tensor], q: Tensor, k: Tensor, v: Tensor, *, key_mask: Tensor | None
    ) -> Tensor:
        """Rounds weighted by exp(z_r - z) ("Multi-round LSH attention"), plus the own key where nothing else
        is visible ("Causal masking for shared-QK attention"). q is already scaled; returns (B, H, Tq, Dv)."""
        tq, tk = q.size(2), k.size(2)
        if self.exclude_self:
            own = torch.arange(tq, device=q.device) + (tk - tq)  # (Tq,) each query's own position
            exists = (own >= 0)[None, :] if key_mask is None else (own >= 0) & key_mask[:, own.clamp(min=0)]
            own = own.clamp(min=0, max=tk - 1)
            k_own, v_own = (k, v) if tq == tk else (k[:, :, own], v[:, :, own])  # (B, H, Tq, Dh)
            alone = ~torch.isfinite(z).any(dim=0) & exists[:, None, :]  # (B, H, Tq): nothing else visible
            z_own = torch.where(alone, (q * k_own).sum(-1), float("-inf"))  # (B, H, Tq)
            z, out = torch.cat([z, z_own[None]]), [*out, v_own]
        weights = safe_softmax(z, dim=0)  # (R [+1], B, H, Tq)
        # One round at a time: no (R, B, H, Tq, Dv) product or copy of the rounds' contexts.
        return sum(w[..., None] * o for w, o in zip(weights, out, strict=True))

    def _rounds_dense(
        self, q: Tensor, k: Tensor, v: Tensor, qb: Tensor, kb: Tensor, *, causal: bool
    ) -> tuple[Tensor, Tensor]:
        """Every round on the full (Tq, Tk) grid: the definition of what each query sees.

        q (B, H, Tq, Dh) scaled, k/v (B, H, Tk, Dh), qb (R, B, H, Tq) and kb (R, B, H, Tk) buckets.
        Returns each round's log-sum-exp (R, B, H, Tq) and context (R, B, H, Tq, Dv).
        """
        tq, tk, m = q.size(2), k.size(2), self.chunk_size
        qpos = torch.arange(tq, device=q.device)[:, None] + (tk - tq)  # (Tq, 1)
        kpos = torch.arange(tk, device=q.device)[None, :]  # (1, Tk)
        before = kpos <= qpos  # keys sorted before the query within a bucket (its own position included)
        same = qb[..., :, None] == kb[..., None, :]  # (R, B, H, Tq, Tk)
        scores = q @ k.transpose(-1, -2)  # (B, H, Tq, Tk)
        if self.n_hashes > 1:  # N_ij: rounds in which key j shares query i's bucket
            scores = scores - same.sum(0).clamp(min=1).to(q.dtype).log()
        zs, outs = [], []
        for r in range(self.n_hashes):
            earlier = same[r] & before
            keep = earlier & (earlier.flip(-1).cumsum(-1).flip(-1) <= m)  # the m nearest before it
            if not causal:
                later = same[r] & ~before
                keep = keep | (later & (later.cumsum(-1) <= m))  # and the m nearest after it
            if self.exclude_self:
                keep = keep & (kpos != qpos)
            z, out = masked_softmax_lse(scores, keep, v)
            zs.append(z)
            outs.append(out)
        return torch.stack(zs), torch.stack(outs)

    def _rounds_chunked(
        self, q: Tensor, k: Tensor, v: Tensor, qb: Tensor, kb: Tensor, *, causal: bool
    ) -> tuple[Tensor, Tensor]:
        """The same rounds as :meth:`_rounds_dense`, computed chunk by chunk on the sorted items.

        Queries and keys are sorted together by (bucket, position, key before query); each chunk of
        ``chunk_size`` items holds at most that many keys, so a slab of sorted keys from ``chunk_size``
        before the chunk to ``chunk_size`` (2 x when not causal) after its first key holds every key its
        queries may see. Memory: (items / chunk) x chunk x slab scores per round.
        """
        return self._each_round(self._round_chunked, q, k, v, qb, kb, causal=causal)

    def _rounds_shared(
        self, q: Tensor, k: Tensor, v: Tensor, qb: Tensor, kb: Tensor, *, causal: bool
    ) -> tuple[Tensor, Tensor]:
        """The same rounds as :meth:`_rounds_dense` for shared-QK self-attention (Tq == Tk, qb == kb).

        Each token is one item: sorted by (bucket, position), the keys a query may see are the items from
        ``chunk_size - 1`` before it to ``chunk_size`` after it (causal: up to itself) that share its bucket,
        so chunk c of the sorted items attends chunks c-1, c and (not causal) c+1: the paper's look-back,
        one chunk further where the site is not causal. Memory: items x (2 or 3) x chunk scores per round.
        ``recompute`` works per block of chunks inside the round (:mod:`~app.attention.kernels.lsh_shared`).
        """
        q, k, v = (x.contiguous() for x in (q, k, v))  # (B, H, T, Dh) rows to gather; once for all rounds
        shared = SharedRounds(self.chunk_size, self.n_hashes, self.exclude_self, lean=self.recompute)
        rounds = [shared.round(q, k, v, kb, r, causal=causal) for r in range(self.n_hashes)]
        return torch.stack([z for z, _ in rounds]), [out for _, out in rounds]

    def _each_round(
        self, one_round, q: Tensor, k: Tensor, v: Tensor, qb: Tensor, kb: Tensor, *, causal: bool
    ) -> tuple[Tensor, list[Tensor]]:
        """``one_round`` over the rounds: (R, B, H, Tq) log-sum-exps and R (B, H, Tq, Dv) contexts (a list:
        stacking would copy them); with ``recompute``, each round is recomputed in the backward pass."""
        zs, outs = [], []
        recompute = self.recompute and torch.is_grad_enabled()
        for r in range(self.n_hashes):
            if recompute:  # buckets are integers: the recomputed round sorts and masks exactly alike
                z, out = checkpoint(one_round, q, k, v, qb, kb, r, causal=causal, use_reentrant=False)
            else:
                z, out = one_round(q, k, v, qb, kb, r, causal=causal)
            zs.append(z)
            outs.append(out)
        return torch.stack(zs), outs

    def _round_chunked(
        self, q: Tensor, k: Tensor, v: Tensor, qb: Tensor, kb: Tensor, r: int, *, causal: bool
    ) -> tuple[Tensor, Tensor]:
        """Round ``r`` of :meth:`_rounds_chunked`: (B, H, Tq) log-sum-exp and (B, H, Tq, Dv) context."""
        batch, heads, tq, _ = q.shape
        tk = k.size(2)
        rows, ins, slab, slab_ok = _sort_and_chunk(qb[r], kb[r], self.chunk_size, causal=causal)
        is_query = (rows >= tk) & (rows < tk + tq)  # (B, H, C, m): the sorted items that are queries
        q_idx = (rows - tk).clamp(0, max(tq - 1, 0))  # (B, H, C, m)
        keep = self._chunk_mask(qb[r], kb[r], q_idx, ins, slab, slab_ok, causal=causal, tk=tk, tq=tq)
        keep = keep & is_query[..., None]  # (B, H, C, m, W)
        q_rows = take(q, q_idx)  # (B, H, C, m, Dh)
        k_slab, v_slab = take(k, slab), take(v, slab)  # (B, H, C, W, Dh)
        scores = torch.einsum("bhcmd,bhcwd->bhcmw", q_rows, k_slab)  # (B, H, C, m, W)
        if self.n_hashes > 1:  # N_ij: rounds in which key j shares query i's bucket
            all_q, all_k = take(bucket_codes(qb), q_idx), take(bucket_codes(kb), slab)  # (B, H, C, m|W, R)
            repeats = (all_q[..., :, None, :] == all_k[..., None, :, :]).sum(-1, dtype=torch.uint8)
            scores = scores - repeats.to(scores.dtype).clamp_(min=1).log_()
        z, out = masked_softmax_lse(scores, keep, v_slab)  # (B, H, C, m), (B, H, C, m, Dv)
        # Back to query order: each query is one row; key and padding rows go to a slot that is dropped.
        target = torch.where(is_query, q_idx, tq).flatten(2)  # (B, H, C * m)
        z_q = z.new_full((batch, heads, tq + 1), float("-inf")).scatter(2, target, z.flatten(2))
        index = target[..., None].expand(-1, -1, -1, out.size(-1))
        out_q = out.new_zeros(batch, heads, tq + 1, out.size(-1)).scatter(2, index, out.flatten(2, 3))
        return z_q[..., :tq], out_q[:, :, :tq]

    def _chunk_mask(
        self,
        qb: Tensor,
        kb: Tensor,
        q_idx: Tensor,
        ins: Tensor,
        slab: Tensor,
        slab_ok: Tensor,
        *,
        causal: bool,
        tk: int,
        tq: int,
    ) -> Tensor:
        """(B, H, C, m, W) which slab keys each row's query sees: its window in sorted key order (``m`` keys
        before it and, not causal, ``m`` after), its bucket, causality and the self rule."""
        m = self.chunk_size
        qpos, kpos = q_idx + (tk - tq), slab  # positions of the rows' queries and of the slab's keys
        first = ins[..., :1, None] - m  # (B, H, C, 1, 1): sorted index of the slab's first key
        sorted_index = first + torch.arange(slab.size(-1), device=slab.device)  # (B, H, C, 1, W)
        after = 0 if causal else m
        keep = (sorted_index >= ins[..., None] - m) & (sorted_index < ins[..., None] + after)
        same = take(qb, q_idx)[..., None] == take(kb, slab)[..., None, :]
        keep = keep & slab_ok[..., None, :] & same
        if causal:
            keep = keep & (kpos[..., None, :] <= qpos[..., None])
        if self.exclude_self:
            keep = keep & (kpos[..., None, :] != qpos[..., None])
        return keep


def _sort_and_chunk(qb: Tensor, kb: Tensor, m: int, *, causal: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sort queries and keys of one round together and cut the sorted items into chunks of ``m``.

    qb (B, H, Tq), kb (B, H, Tk) buckets. Returns, per chunk c: ``rows`` (B, H, C, m) the items (key j as
    j, query i as Tk + i, padding as Tk + Tq), ``ins`` (B, H, C, m) how many keys sort before each item,
    ``slab`` (B, H, C, W) the original indices of the sorted keys from ``m`` before the chunk's first key
    (W = 2m causal, 3m otherwise) and ``slab_ok`` (B, H, C, W) which of them exist.
    """
    batch, heads, tq = qb.shape
    tk = kb.size(-1)
    device = qb.device
    span = tq + tk + 1  # positions, shifted by tq so that queries before the first key stay >= 0
    kpos = torch.arange(tk, device=device) + tq
    qpos = torch.arange(tq, device=device) + tk
    key_value = (kb * span + kpos) * 2  # (B, H, Tk): by bucket, position, and a key before a query
    query_value = (qb * span + qpos) * 2 + 1
    order = torch.cat([key_value, query_value], dim=-1).argsort(dim=-1)  # (B, H, Tk + Tq)
    is_key = (order < tk).long()
    ins = is_key.cumsum(-1) - is_key  # keys before each sorted item
    key_order = key_value.argsort(dim=-1)  # (B, H, Tk): sorted key index -> key index
    items = order.size(-1)
    chunks = math.ceil(items / m)
    pad = chunks * m - items
    rows = torch.cat([order, order.new_full((batch, heads, pad), tk + tq)], dim=-1).view(
        batch, heads, chunks, m
    )
    ins = torch.cat([ins, ins.new_full((batch, heads, pad), tk)], dim=-1).view(batch, heads, chunks, m)
    width = m * (2 if causal else 3)
    sorted_slab = ins[..., :1] - m + torch.arange(width, device=device)  # (B, H, C, W)
    slab_ok = (sorted_slab >= 0) & (sorted_slab < tk)
    slab = key_order.gather(-1, sorted_slab.clamp(0, max(tk - 1, 0)).flatten(2)).view(
        batch, heads, chunks, width
    )
    return rows, ins, slab, slab_ok
