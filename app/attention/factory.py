"""Build the attention of each Transformer site from the ``attention`` config group.

The group sets every site at once; ``sites.<name>`` overrides single fields for one site, e.g.
``+attention.sites.cross.kernel=eager`` keeps full cross-attention under a sparse self-attention
(Hydra's ``+`` adds a key that the YAML files leave out).
Keys other than ``kernel``, ``num_kv_heads`` and ``dropout`` are the kernel's options
(``attention=sparse attention.window=64``): a site override that switches to another kernel starts from
that override's own options (none if it gives none), never from the group's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from app.attention.multihead import MultiHeadAttention
from app.attention.registry import (
    AttentionConfigError,
    available_kernels,
    build_kernel,
    kernel_class,
    kernel_options,
)

SITES = ("encoder_self", "decoder_self", "cross")

# What each site asks of its kernel: (needs a padding mask, needs causal masking, decodes incrementally).
SITE_NEEDS = {
    "encoder_self": {"padding_mask": True, "causal": False, "incremental": False},
    "decoder_self": {"padding_mask": False, "causal": True, "incremental": True},
    "cross": {"padding_mask": True, "causal": False, "incremental": True},
}


@dataclass(frozen=True)
class AttentionSpec:
    """Settings of one attention site."""

    kernel: str = "eager"  # a registered kernel name
    num_kv_heads: int | None = None  # None = num_heads (MHA); 1 = MQA; a divisor in between = GQA
    dropout: float = 0.0  # dropout on attention weights
    options: Mapping[str, Any] = field(default_factory=dict)  # kernel-specific settings


def site_specs(cfg: Mapping[str, Any]) -> dict[str, AttentionSpec]:
    """Resolve the group config into one spec per site, naming any unknown key."""
    cfg = dict(cfg)
    sites = dict(cfg.pop("sites", None) or {})
    base = _spec_from(cfg, where="attention")
    unknown = set(sites) - set(SITES)
    if unknown:
        raise AttentionConfigError(
            f"unknown attention site(s) {sorted(unknown)}; valid sites: {', '.join(SITES)}"
        )
    return {
        site: _merge(base, dict(sites.get(site) or {}), where=f"attention.sites.{site}") for site in SITES
    }


def _spec_from(cfg: Mapping[str, Any], *, where: str) -> AttentionSpec:
    return _merge(AttentionSpec(), cfg, where=where)


def _merge(spec: AttentionSpec, overrides: Mapping[str, Any], *, where: str) -> AttentionSpec:
    """``spec`` updated by ``overrides``; keys that are not spec fields are the kernel's options.

    Kernel options sit beside the spec keys (``attention.window=64``); the nested ``options:`` mapping
    of configs stored in older checkpoints is read too. A key that is neither is named with its place.
    """
    spec_keys = {f.name for f in fields(AttentionSpec)} - {"options"}
    overrides = {k: v for k, v in overrides.items() if k != "name"}
    own_options = dict(overrides.pop("options", None) or {})
    own_options.update({k: overrides.pop(k) for k in list(overrides) if k not in spec_keys})
    kernel = overrides.get("kernel", spec.kernel)
    valid_options = kernel_options(kernel)
    bad = sorted(set(own_options) - set(valid_options))
    if bad:
        raise AttentionConfigError(
            f"unknown key(s) {bad} in {where}; valid keys: {sorted(spec_keys)}, and the options of "
            f"kernel {kernel!r}: {valid_options or 'none'}"
        )
    if kernel == spec.kernel:
        own_options = {**spec.options, **own_options}
    # else: another kernel's options would be rejected or misread, so the site starts from its own
    return replace(spec, **overrides, options=own_options)


def build_attention(spec: AttentionSpec, *, site: str, d_model: int, num_heads: int) -> MultiHeadAttention:
    """One attention layer for ``site``, after checking that its kernel can serve that site."""
    check_kernel_fits_site(spec.kernel, site)
    check_dropout(spec, site=site)
    return MultiHeadAttention(
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=spec.num_kv_heads,
        kernel=build_kernel(spec.kernel, **dict(spec.options)),
        dropout=spec.dropout,
    )


def check_kernel_fits_site(kernel: str, site: str) -> None:
    caps = kernel_class(kernel).capabilities
    missing = [need for need, wanted in SITE_NEEDS[site].items() if wanted and not getattr(caps, need)]
    if missing:
        raise AttentionConfigError(
            f"attention kernel {kernel!r} cannot serve the {site} site: it lacks {', '.join(missing)}"
        )


def check_dropout(spec: AttentionSpec, *, site: str) -> None:
    """Reject attention dropout for kernels that have no attention weights to drop (e.g. linear).

    Fused kernels (sdpa, flash) apply it inside the kernel, so only ``attention_dropout=False`` fails;
    failing here, when the model is built, beats failing at the first training step.
    """
    if spec.dropout and not kernel_class(spec.kernel).capabilities.attention_dropout:
        able = [name for name in available_kernels() if kernel_class(name).capabilities.attention_dropout]
        raise AttentionConfigError(
            f"attention kernel {spec.kernel!r} cannot apply attention dropout (dropout={spec.dropout} at the "
            f"{site} site): set attention.dropout=0 (attention.sites.{site}.dropout=0 for this site only) "
            f"or use a kernel that can: {', '.join(able)}"
        )
