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
* ``favor`` with ``learned: true``: W becomes a parameter, one per key/value head (drawn from ``seed`` +
  the head's index), trained with the model: a learned feature map, as T2R learns one to stand in for a
  trained softmax (Kasai et al. 2021, "Finetuning Pretrained Transformers into RNNs", section 3.1, with
  an MLP relu(W x + b)). Starting from the random draw, the first step is FAVOR+'s unbiased estimate of
  the softmax kernel, which a trained softmax layer converted to linear attention wants
  (:meth:`LinearAttention.start_from_softmax`); T2R's relu map has no such start.

Key padding zeroes phi(k) at padded keys, so they add nothing to either sum. Rows that see no key give
0 / (0 + eps) = 0. There is no attention matrix, so weights cannot be returned and weight dropout does
not apply. :meth:`LinearAttention.recurrent_step` carries the O(1)-size state for incremental decoding
(section 3.4 of Katharopoulos et al. 2020): cached causal self-attention in
:class:`~app.attention.multihead.MultiHeadAttention` keeps that state instead of growing keys and values.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from app.attention.base import AttentionKernel, AttentionOutput, KernelCapabilities
from app.attention.cache import AttentionCache, RecurrentCache, ReducedCache
from app.attention.kernels.linear_ops import (
    LinearAttentionState,
    causal_scan,
    half_sq_norms,
    orthogonal_random_features,
    prefix_state,
)
from app.attention.registry import AttentionConfigError, register_kernel

FEATURE_MAPS = ("elu", "favor")


def _refuse_weights(*, need_weights: bool, dropout_p: float) -> None:
    """Linear attention forms no attention matrix: no weights to return, none to drop."""
    if need_weights:
        raise ValueError("the linear kernel cannot return attention weights; use kernel=eager")
    if dropout_p > 0:
        raise AttentionConfigError(
            f"the linear kernel has no attention weights to drop (dropout_p={dropout_p}); "
            "set attention.dropout=0"
        )


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
        learned: bool = False,
    ) -> None:
        super().__init__()
        if feature_map not in FEATURE_MAPS:
            raise AttentionConfigError(
                f"unknown linear attention feature_map {feature_map!r}; "
                f"valid choices: {', '.join(FEATURE_MAPS)}"
            )
        if not isinstance(learned, bool) or (learned and feature_map != "favor"):
            raise AttentionConfigError(
                f"linear attention learned={learned!r} must be true or false, and true only with "
                f"feature_map=favor (elu has no parameters to learn), got feature_map={feature_map!r}"
            )
        for name, value in {"num_features": num_features, "chunk_size": chunk_size}.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AttentionConfigError(f"linear attention {name}={value!r} must be an integer >= 1")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise AttentionConfigError(f"linear attention seed={seed!r} must be an integer")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
            raise AttentionConfigError(f"linear attention eps={eps!r} must be a number > 0")
        self.feature_map, self.num_features, self.seed = feature_map, num_features, seed
        self.eps, self.chunk_size, self.learned = float(eps), chunk_size, learned
        self._projections: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}
        self.weight: nn.Parameter | None = None  # learned: (Hkv, m, Dh), made by bind()

    def bind(self, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """``learned``: W, one (m, Dh) draw per key/value head (seed + its index), as a parameter."""
        if self.learned:
            self.weight = nn.Parameter(self.random_draw(num_kv_heads, head_dim))

    def random_draw(self, heads: int, dim: int) -> Tensor:
        """(heads, m, dim) float32: head h's orthogonal random features from ``seed + h``."""
        draws = [orthogonal_random_features(self.num_features, dim, self.seed + h) for h in range(heads)]
        return torch.stack(draws).float()

    def extra_repr(self) -> str:
        learned = ", learned=True" if self.learned else ""
        return f"feature_map={self.feature_map!r}, num_features={self.num_features}, eps={self.eps}{learned}"

    def describe(self) -> str:
        if self.feature_map == "favor":
            return f"{self.name} favor m={self.num_features}" + (" learned" if self.learned else "")
        return f"{self.name} {self.feature_map}"

    def start_from_softmax(self) -> str:
        """``learned``: W set to the random draw, where phi(q).phi(k) estimates the trained softmax kernel
        exp(q.k / sqrt(d)) without bias; the fixed maps have nothing to set."""
        if self.weight is not None:
            with torch.no_grad():
                self.weight.copy_(self.random_draw(*self.weight.shape[:1], self.weight.size(-1)))
            return (
                f"W = orthogonal random features (seed {self.seed} + head), learned from there: at the first "
                "step phi(q).phi(k) estimates exp(q.k / sqrt(d)), the trained softmax kernel, without bias "
                "(FAVOR+), then uptraining fits the map (a learned feature map, as in T2R, Kasai et al. 2021)"
            )
        return (
            f"no kernel parameters: the {self.feature_map} feature map is fixed, not learned "
            "(attention.feature_map=favor attention.learned=true learns one, T2R-style), so the trained "
            "projections are taken as they are and uptraining adapts them to phi(q).phi(k) in place of "
            "exp(q.k / sqrt(d))"
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
        """The FAVOR+ random features W (m, dim), drawn once per head width and device; ``learned``: the
        parameter (Hkv, m, dim).

        A fixed W is a function of (seed, m, dim) only, so it is not a buffer: checkpoints need not store it.
        """
        if self.learned:
            if self.weight is None:
                raise RuntimeError(
                    "a learned feature map is made by bind(); build the layer around the kernel"
                )
            return self.weight.to(dtype)
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
        exponent = x @ w.transpose(-1, -2) - (x * x).sum(-1, keepdim=True) / 2 - half_sq_norms(w)
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
        exponent = x @ w.transpose(-1, -2) - (x * x).sum(-1, keepdim=True) / 2 + half_sq_norms(w)
        shift = exponent.amax(-1, keepdim=True).detach()  # (..., T, 1)
        features = torch.exp(exponent - shift) / math.sqrt(self.num_features)
        return features, self.eps * torch.exp(-shift)

    def _favor_inputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x / d^(1/4) and W: (m, d), or a learned map's (Hkv, m, d) repeated for x's (B, H, T, d) heads
        (the queries of a group share their key/value head's map)."""
        dim = x.size(-1)
        w = self.projection(dim, x.device, x.dtype)
        if w.dim() == 3 and x.size(1) != w.size(0):
            w = w.repeat_interleave(x.size(1) // w.size(0), dim=0)
        return x * dim**-0.25, w

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
        state = prefix_state(phi_k[:, :, :prefix], v[:, :, :prefix]) if prefix else None
        live, _ = causal_scan(
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
        context, state = causal_scan(phi_q, eps_row, phi_k, values, state, self.chunk_size)
        return context.flatten(1, 2).to(q.dtype), state
