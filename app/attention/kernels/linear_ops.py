"""Tensor pieces of linear attention (:mod:`app.attention.kernels.linear`): the recurrent state, the
chunked causal scan that computes it, and FAVOR+'s orthogonal random features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


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


def causal_scan(
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


def half_sq_norms(w: Tensor) -> Tensor:
    """|w_r|^2 / 2 of W's rows, to add to (..., T, m) exponents: (m,) of a fixed W, (H, 1, m) of a learned."""
    half = (w * w).sum(-1) / 2
    return half if w.dim() == 2 else half[:, None, :]


def prefix_state(phi_k: Tensor, v: Tensor) -> LinearAttentionState:
    """The state after keys phi_k (B, Hkv, T, m) with values v (B, Hkv, T, Dv)."""
    return LinearAttentionState(kv=phi_k.transpose(-1, -2) @ v, z=phi_k.sum(-2))
