"""Linear attention: softmax-free attention through a feature map, linear in the sequence length.

Katharopoulos et al. 2020 ("Transformers are RNNs", eq. 4-6) replace exp(q . k / sqrt(d)) by
phi(q) . phi(k), so that attention over keys 1..N factorises:

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps)

Without causal masking the two sums are computed once over all (real) keys; with causal masking they
are prefix sums, i.e. a recurrent state (S_i, z_i) = (S_{i-1} + phi(k_i) v_i^T, z_{i-1} + phi(k_i)) --
here computed ``chunk_size`` positions at a time (quadratic inside a chunk, the state across chunks, all
chunks in one batched scan), so memory stays O(T x chunk + T / chunk x features x Dv) instead of one
outer product per position. The result equals
the quadratic form ``A = mask(phi(Q) phi(K)^T)``, each row divided by its sum plus ``eps``.

Feature maps (``feature_map`` option):

* ``elu``: phi(x) = elu(x) + 1 (Katharopoulos et al. 2020, section 3.2.1).
* ``favor``: positive orthogonal random features phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m) with
  x' = x / d^(1/4), so that E[phi(q) . phi(k)] = exp(q . k / sqrt(d)) (Choromanski et al. 2021,
  "Rethinking Attention with Performers", Lemma 1 and section 4, FAVOR+). W (m = ``num_features``
  rows) is drawn once per head width from ``seed``; it is not redrawn during training.

Key padding zeroes phi(k) at padded keys, so they add nothing to either sum. Rows that see no key give
0 / (0 + eps) = 0. There is no attention matrix, so weights cannot be returned and weight dropout does
not apply. :meth:`LinearAttention.recurrent_step` carries the O(1)-size state for incremental decoding
(section 3.4 of Katharopoulos et al. 2020): cached causal self-attention in
:class:`~app.attention.multihead.MultiHeadAttention` keeps that state instead of growing keys and values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.cache import AttentionCache, RecurrentCache, ReducedCache
from app.attention.registry import AttentionConfigError, register_kernel

FEATURE_MAPS = ("elu", "favor")


@dataclass
class LinearAttentionState:
    """The recurrent state of causal linear attention after some prefix of keys (one layer)."""

    kv: Tensor  # (B, Hkv, m, Dv): sum_j phi(k_j) v_j^T
    z: Tensor  # (B, Hkv, m): sum_j phi(k_j)

    def reorder(self, index: Tensor) -> LinearAttentionState:
        """Select batch rows (beam search keeps the surviving hypotheses)."""
        return LinearAttentionState(kv=self.kv.index_select(0, index), z=self.z.index_select(0, index))

    def nbytes(self) -> int:
        """Bytes held: (m x Dv + m) numbers per kv head, whatever the number of positions seen."""
        return sum(t.numel() * t.element_size() for t in (self.kv, self.z))


def orthogonal_random_features(num_features: int, dim: int, seed: int) -> Tensor:
    """(m, d) float64 projection: blocks of orthogonal rows, each scaled to the norm of a Gaussian vector.

    Orthogonal rows lower the variance of the estimate; chi-distributed norms keep it unbiased
    (Choromanski et al. 2021, section 2.4).
    """
    gen = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        orthogonal, upper = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
        # Fixing the signs of R's diagonal makes Q uniformly (Haar) distributed, so every row direction
        # is uniform on the sphere; without it the directions, and the estimate, are biased.
        orthogonal = orthogonal * torch.sign(torch.diagonal(upper))
        blocks.append(orthogonal.T)
    rows = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, dim, generator=gen, dtype=torch.float64).norm(dim=1)
    return rows * norms[:, None]


def _causal_linear(
    phi_q: Tensor,
    eps_row: Tensor,
    phi_k: Tensor,
    v: Tensor,
    state: LinearAttentionState | None,
    chunk_size: int,
) -> tuple[Tensor, LinearAttentionState]:
    """Causal linear attention of aligned queries and keys, starting from ``state`` (None = no prefix).

    phi_q (B, Hkv, G, T, m), eps_row (B, Hkv, G, T, 1), phi_k (B, Hkv, T, m), v (B, Hkv, T, Dv).
    Returns the context (B, Hkv, G, T, Dv) and the state after the T keys.

    A chunked scan, batched over the chunks (no loop; Katharopoulos et al. 2020, section 3.3, a chunk at a
    time): inside a chunk of C positions the masked (C, C) products phi(Q) phi(K)^T; across chunks each
    chunk's phi(K)^T [V, 1] (the sums of eq. 5, the normaliser's as a last column of ones), summed along
    the chunk axis, give each chunk the state before it (the cumulative sum less the chunk's own term).
    Positions past T (padding to whole chunks) have zero features and are cut from the result.
    """
    b, kv_heads, t, m = phi_k.shape
    dv = v.size(-1)
    if t == 0:
        kv0 = phi_k.new_zeros(b, kv_heads, m, dv) if state is None else state.kv
        z0 = phi_k.new_zeros(b, kv_heads, m) if state is None else state.z
        return phi_q.new_zeros(*phi_q.shape[:-1], dv), LinearAttentionState(kv=kv0, z=z0)
    size = min(chunk_size, t)
    n = -(-t // size)  # chunks
    pad = n * size - t
    values = torch.cat([v, v.new_ones(b, kv_heads, t, 1)], dim=-1)  # (B, Hkv, T, Dv + 1)
    if pad:
        phi_q, phi_k, values = (F.pad(x, (0, 0, 0, pad)) for x in (phi_q, phi_k, values))
        eps_row = F.pad(eps_row, (0, 0, 0, pad), value=1.0)  # no 0 / 0 in the cut rows
    qc, ec = phi_q.unflatten(-2, (n, size)), eps_row.unflatten(-2, (n, size))  # (B, Hkv, G, n, C, m | 1)
    kc, vc = phi_k.unflatten(-2, (n, size)), values.unflatten(-2, (n, size))  # (B, Hkv, n, C, m | Dv + 1)
    per_chunk = kc.transpose(-1, -2) @ vc  # (B, Hkv, n, m, Dv + 1)
    after = per_chunk.cumsum(2)  # the sums after each chunk
    before = after - per_chunk  # exclusive: the first chunk's is exactly 0
    if state is not None:
        prefix = torch.cat([state.kv, state.z[..., None]], dim=-1)  # (B, Hkv, m, Dv + 1)
        before, after = before + prefix[:, :, None], after + prefix[:, :, None]
    within = (qc @ kc[:, :, None].transpose(-1, -2)).tril()  # (B, Hkv, G, n, C, C): key j <= query i
    out = qc @ before[:, :, None] + within @ vc[:, :, None]  # (B, Hkv, G, n, C, Dv + 1)
    context = (out[..., :dv] / (out[..., dv:] + ec)).flatten(-3, -2)  # (B, Hkv, G, n * C, Dv)
    last = after[:, :, -1]  # (B, Hkv, m, Dv + 1)
    return context[..., :t, :], LinearAttentionState(kv=last[..., :dv], z=last[..., dv])


def _refuse_weights(*, need_weights: bool, dropout_p: float) -> None:
    """Linear attention forms no attention matrix: no weights to return, none to drop."""
    if need_weights:
        raise ValueError("the linear kernel cannot return attention weights; use kernel=eager")
    if dropout_p > 0:
        raise AttentionConfigError(
            f"the linear kernel has no attention weights to drop (dropout_p={dropout_p}); "
            "set attention.dropout=0"
        )


def _prefix_state(phi_k: Tensor, v: Tensor) -> LinearAttentionState:
    """The state after keys phi_k (B, Hkv, T, m) with values v (B, Hkv, T, Dv)."""
    return LinearAttentionState(kv=phi_k.transpose(-1, -2) @ v, z=phi_k.sum(-2))


@register_kernel("linear")
class LinearAttention(AttentionKernel):
    """Kernelised (softmax-free) attention with a choice of feature map; see the module docstring."""

    capabilities = KernelCapabilities(
        padding_mask=True,
        causal=True,
        returns_weights=False,
        incremental=True,
        exact=False,
        recurrent=True,  # causal decoding: the state (S, z) replaces the KV cache
        attention_dropout=False,  # no attention matrix to drop entries from
        shares_keys=True,  # non-causal: each query's features and normaliser are its own
        reduces_keys=True,  # non-causal: the two sums over the keys (reduce) are all a query needs
    )

    def __init__(
        self,
        *,
        feature_map: str = "elu",
        num_features: int = 64,
        seed: int = 0,
        eps: float = 1e-6,
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        if feature_map not in FEATURE_MAPS:
            raise AttentionConfigError(
                f"unknown linear attention feature_map {feature_map!r}; "
                f"valid choices: {', '.join(FEATURE_MAPS)}"
            )
        for name, value in {"num_features": num_features, "chunk_size": chunk_size}.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AttentionConfigError(f"linear attention {name}={value!r} must be an integer >= 1")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise AttentionConfigError(f"linear attention seed={seed!r} must be an integer")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise AttentionConfigError(f"linear attention eps={eps!r} must be a number > 0")
        self.feature_map, self.num_features, self.seed = feature_map, num_features, seed
        self.eps, self.chunk_size = float(eps), chunk_size
        self._projections: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}

    def extra_repr(self) -> str:
        return f"feature_map={self.feature_map!r}, num_features={self.num_features}, eps={self.eps}"

    def describe(self) -> str:
        if self.feature_map == "favor":
            return f"{self.name} favor m={self.num_features}"
        return f"{self.name} {self.feature_map}"

    def start_from_softmax(self) -> str:
        """Nothing to set: the feature map is fixed, not learned (no T2R map, Kasai et al. 2021)."""
        return (
            f"no kernel parameters: the {self.feature_map} feature map is fixed, not learned (there is no "
            "T2R map to fit, Kasai et al. 2021), so the trained projections are taken as they are and "
            "uptraining adapts them to phi(q).phi(k) in place of exp(q.k / sqrt(d))"
        )

    def feature_size(self, head_dim: int) -> int:
        """m, the width of phi(x) for a head of ``head_dim``: elu keeps it, FAVOR+ draws ``num_features``."""
        return head_dim if self.feature_map == "elu" else self.num_features

    def new_cache(self, *, cross: bool) -> AttentionCache:
        """Causal self-attention keeps the recurrent state (S, z) (section 3.4), cross-attention the two
        sums over the source (:meth:`reduce`), computed once per sentence."""
        return ReducedCache(shared=self.capabilities.shares_keys) if cross else RecurrentCache()

    def cache_bytes(self, length: int, *, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """The fixed-size decoding state (S, z): m x Dh + m numbers per kv head whatever ``length`` is,
        kept in float32 or wider (see :meth:`_features`)."""
        if length == 0:
            return 0  # no state before the first token
        m = self.feature_size(head_dim)
        work = torch.promote_types(dtype, torch.float32)
        return num_kv_heads * (m * head_dim + m) * work.itemsize

    def scores_per_query(self, length: int, *, head_dim: int) -> int:
        """The chunk's scores and the query's features, kept with their gradients; not the length."""
        return 4 * (min(length, self.chunk_size) + self.feature_size(head_dim))

    # --- feature maps -------------------------------------------------------------------------------

    def projection(self, dim: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The FAVOR+ random features W (m, dim), drawn once per head width and device.

        W is a function of (seed, m, dim) only, so it is not a buffer: checkpoints need not store it.
        """
        key = (dim, device, dtype)
        if key not in self._projections:
            w = orthogonal_random_features(self.num_features, dim, self.seed)
            self._projections[key] = w.to(device=device, dtype=dtype)
        return self._projections[key]

    def key_features(self, k: Tensor) -> Tensor:
        """phi(k): (..., T, Dh) -> (..., T, m)."""
        if self.feature_map == "elu":
            return F.elu(k) + 1
        x, w = self._favor_inputs(k)
        # exp(w.x - |x|^2/2 - |w|^2/2) = exp(-|x - w|^2 / 2) <= 1: the |w|^2/2 taken here is given
        # back on the query side, so phi(q) . phi(k) is unchanged and no key feature can overflow.
        exponent = x @ w.T - (x * x).sum(-1, keepdim=True) / 2 - (w * w).sum(-1) / 2
        return torch.exp(exponent) / math.sqrt(self.num_features)

    def query_features(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """phi(q) (..., T, m) and the row's eps (..., T, 1), both scaled by the same per-row constant.

        FAVOR+ query features are divided by exp(c) with c their row maximum (a constant; it cancels
        between numerator and denominator), so eps is divided by it too and the result is exactly
        num / (den + eps) of the unscaled features.
        """
        if self.feature_map == "elu":
            return F.elu(q) + 1, q.new_full((*q.shape[:-1], 1), self.eps)
        x, w = self._favor_inputs(q)
        exponent = x @ w.T - (x * x).sum(-1, keepdim=True) / 2 + (w * w).sum(-1) / 2
        shift = exponent.amax(-1, keepdim=True).detach()  # (..., T, 1)
        features = torch.exp(exponent - shift) / math.sqrt(self.num_features)
        return features, self.eps * torch.exp(-shift)

    def _favor_inputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        dim = x.size(-1)
        return x * dim**-0.25, self.projection(dim, x.device, x.dtype)

    # --- attention ----------------------------------------------------------------------------------

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
    ) -> AttentionOutput:
        _refuse_weights(need_weights=need_weights, dropout_p=dropout_p)
        if not causal:
            return self.attend_reduced(q, *self.reduce(k, v, key_mask))
        phi_q, eps_row, phi_k, values = self._features(q, k, v, key_mask)
        context = self._causal(phi_q, eps_row, phi_k, values, offset=k.size(2) - q.size(2))
        return AttentionOutput(context=context.flatten(1, 2).to(q.dtype))  # (B, H, Tq, Dv)

    def reduce(self, k: Tensor, v: Tensor, key_mask: Tensor | None) -> tuple[Tensor, Tensor, None]:
        """The two sums over the keys, once per sentence: sum_j phi(k_j) v_j^T (B, Hkv, m, Dv) in the keys'
        place and sum_j phi(k_j) (B, Hkv, m, 1) in the values' (eq. 5; padded keys add nothing), in the
        working precision of :meth:`_features`. Cross-attention's decoding cache holds these instead of
        the source's keys and values, so a decoding step costs O(m Dv), not O(source length)."""
        work = torch.promote_types(k.dtype, torch.float32)
        phi_k = self.key_features(k.to(work))  # (B, Hkv, Tk, m)
        if key_mask is not None:
            phi_k = phi_k * key_mask[:, None, :, None]
        return phi_k.transpose(-1, -2) @ v.to(work), phi_k.sum(-2)[..., None], None

    def attend_reduced(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_mask: Tensor | None,
        *,
        dropout_p: float = 0.0,
        need_weights: bool = False,
    ) -> AttentionOutput:
        """Non-causal linear attention of ``q`` (B, H, Tq, Dh) from :meth:`reduce`'s sums ``k`` (kv) and
        ``v`` (z): phi(q) kv / (phi(q) z + eps)."""
        _refuse_weights(need_weights=need_weights, dropout_p=dropout_p)
        phi_q, eps_row = self.query_features(q.to(k.dtype))
        phi_q = phi_q.unflatten(1, (k.size(1), -1))  # (B, Hkv, G, Tq, m)
        eps_row = eps_row.unflatten(1, (k.size(1), -1))
        context = (phi_q @ k[:, :, None]) / (phi_q @ v[:, :, None] + eps_row)  # (B, Hkv, G, Tq, Dv)
        return AttentionOutput(context=context.flatten(1, 2).to(q.dtype))  # (B, H, Tq, Dv)

    def _causal(self, phi_q: Tensor, eps_row: Tensor, phi_k: Tensor, v: Tensor, *, offset: int) -> Tensor:
        """Query i sits at position i + offset: keys before the first query form the initial state."""
        dead = max(0, -offset)  # queries before the first key see nothing
        prefix = max(0, offset)
        state = _prefix_state(phi_k[:, :, :prefix], v[:, :, :prefix]) if prefix else None
        live, _ = _causal_linear(
            phi_q[..., dead:, :],
            eps_row[..., dead:, :],
            phi_k[:, :, prefix:],
            v[:, :, prefix:],
            state,
            self.chunk_size,
        )
        if not dead:
            return live
        return torch.cat([live.new_zeros(*live.shape[:3], dead, live.size(-1)), live], dim=-2)

    def _features(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Grouped features: phi(q) (B, Hkv, G, Tq, m), eps (B, Hkv, G, Tq, 1), phi(k) (B, Hkv, Tk, m), v.

        Half-precision inputs are computed in float32: sums over many keys lose too much otherwise.
        """
        work = torch.promote_types(q.dtype, torch.float32)
        kv_heads = k.size(1)
        phi_q, eps_row = self.query_features(q.to(work))
        phi_k = self.key_features(k.to(work))
        if key_mask is not None:
            phi_k = phi_k * key_mask[:, None, :, None]  # padded keys add nothing to either sum
        grouped = (kv_heads, q.size(1) // kv_heads)
        return phi_q.unflatten(1, grouped), eps_row.unflatten(1, grouped), phi_k, v.to(work)

    def recurrent_step(
        self,
        state: LinearAttentionState | None,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, LinearAttentionState]:
        """Causal attention of the next t positions given the state of all earlier ones (an RNN step).

        q (B, H, t, Dh) and k, v (B, Hkv, t, Dh) are the new positions (usually t = 1), ``key_mask``
        (B, t) their padding, ``state`` the result of the previous call (None at the start). Returns the
        context (B, H, t, Dv) and the new state, whose size does not grow with the sequence length;
        the contexts equal the causal forward over the whole sequence.
        """
        if q.size(2) != k.size(2) or k.size(2) != v.size(2):
            raise ValueError(
                f"recurrent_step needs as many queries as new keys, got {q.size(2)} and {k.size(2)}"
            )
        phi_q, eps_row, phi_k, values = self._features(q, k, v, key_mask)
        context, state = _causal_linear(phi_q, eps_row, phi_k, values, state, self.chunk_size)
        return context.flatten(1, 2).to(q.dtype), state
