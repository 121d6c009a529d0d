"""Build the attention layer of each Transformer site from its :class:`~app.attention.config.AttentionSpec`.

Parsing the config lives in :mod:`app.attention.config`; this module checks that a kernel can serve the
site it was given (capabilities, dropout) and builds the layer.
"""

from __future__ import annotations

from app.attention.config import AttentionSpec
from app.attention.multihead import MultiHeadAttention
from app.attention.registry import AttentionConfigError, available_kernels, build_kernel, kernel_class

# What each site asks of its kernel (KernelCapabilities fields): a padding mask, causal masking,
# incremental decoding, attention from one sequence to another.
SITE_NEEDS = {
    "encoder_self": {"padding_mask": True, "causal": False, "incremental": False, "across_sequences": False},
    "decoder_self": {"padding_mask": False, "causal": True, "incremental": True, "across_sequences": False},
    "cross": {"padding_mask": True, "causal": False, "incremental": True, "across_sequences": True},
}


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
    """Refuse a kernel lacking what ``site`` needs, naming the missing capabilities, the kernel's reasons
    (:attr:`~app.attention.base.AttentionKernel.reasons`) and the per-site override that avoids it."""
    cls = kernel_class(kernel)
    caps = cls.capabilities
    missing = [need for need, wanted in SITE_NEEDS[site].items() if wanted and not getattr(caps, need)]
    if missing:
        why = "".join(f" ({cls.reasons[need]})" for need in missing if need in cls.reasons)
        raise AttentionConfigError(
            f"attention kernel {kernel!r} cannot serve the {site} site: it lacks {', '.join(missing)}{why}; "
            f"choose another kernel for this site, e.g. ++attention.sites.{site}.kernel=eager"
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
