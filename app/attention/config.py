"""Read the ``attention`` config of either model family: the one place that parses attention settings.

Hydra composes two independent choices into ``attention`` (see ``conf/train.yaml``):

* the ``attention`` group picks *what* attends: a Transformer kernel (``attention=<kernel>``, one file per
  registered kernel) or an RNN mechanism (a ``mechanism`` and a ``decoder`` key);
* the ``heads`` group picks the Transformer head layout, interpolated into ``attention.num_kv_heads``
  (None = MHA, 1 = MQA, a divisor of num_heads = GQA), so a checkpoint's ``config["attention"]`` holds
  everything needed to rebuild the model.

Transformer configs become one :class:`AttentionSpec` per site (:func:`site_specs`); ``sites.<name>``
overrides single fields for one site, e.g. ``+attention.sites.cross.kernel=eager`` keeps full
cross-attention under a sparse self-attention (Hydra's ``+`` adds a key that the YAML files leave out).
Keys other than ``kernel``, ``num_kv_heads`` and ``dropout`` are the kernel's options
(``attention=sparse attention.window=64``): a site override that switches to another kernel starts from
that override's own options (none if it gives none), never from the group's. RNN configs become an
:class:`RNNAttentionSpec` (:func:`rnn_attention`). Valid choices in every error come from the kernel and
mechanism registries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from app.attention.mechanisms import available_mechanisms, mechanism_class, mechanism_options
from app.attention.registry import (
    AttentionConfigError,
    available_kernels,
    build_kernel,
    kernel_class,
    kernel_options,
)

SITES = ("encoder_self", "decoder_self", "cross")
FAMILY_KEYS = {"transformer": "kernel", "rnn": "mechanism"}  # the key that marks each family's attention


@dataclass(frozen=True)
class AttentionSpec:
    """Settings of one Transformer attention site."""

    kernel: str = "eager"  # a registered kernel name
    num_kv_heads: int | None = None  # None = num_heads (MHA); 1 = MQA; a divisor in between = GQA
    dropout: float = 0.0  # dropout on attention weights
    options: Mapping[str, Any] = field(default_factory=dict)  # kernel-specific settings


@dataclass(frozen=True)
class RNNAttentionSpec:
    """The attention of an RNN decoder: which decoder, which score function, and their options."""

    decoder: str  # bahdanau | luong (app.models.rnn_decoder.DECODERS checks it)
    mechanism: str  # a registered mechanism name
    mechanism_options: Mapping[str, Any] = field(default_factory=dict)
    decoder_options: Mapping[str, Any] = field(default_factory=dict)  # e.g. input_feeding


def attention_choices(family: str) -> list[str]:
    """The registered choices of one family: Transformer kernels or RNN mechanisms."""
    if family not in FAMILY_KEYS:
        raise ValueError(f"unknown model family {family!r}; valid choices: {', '.join(FAMILY_KEYS)}")
    return available_kernels() if family == "transformer" else available_mechanisms()


def check_family(family: str, attention: Mapping[str, Any]) -> None:
    """Stop with the valid choices when ``attention`` was written for the other model family."""
    own = FAMILY_KEYS[family]
    other = next((f for f, key in FAMILY_KEYS.items() if f != family and key in attention), None)
    if other is None or own in attention:
        return
    given = f"{FAMILY_KEYS[other]}={attention[FAMILY_KEYS[other]]!r}"
    raise AttentionConfigError(
        f"attention {given} belongs to the {other} model family and does not fit model={family}; "
        f"valid {own}s for model={family}: {' | '.join(attention_choices(family))}"
    )


# --- Transformer ------------------------------------------------------------------------------------


def site_specs(cfg: Mapping[str, Any], *, max_positions: int | None = None) -> dict[str, AttentionSpec]:
    """Resolve a Transformer ``attention`` config into one spec per site, naming any unknown key.

    ``max_positions`` (the model's) sets each site's length option that the config leaves out
    (:attr:`~app.attention.base.AttentionKernel.length_option`, linformer's ``max_len``), so a kernel
    chosen for one site covers the model's longest sequence, as the group's own kernel does.
    """
    check_family("transformer", cfg)
    cfg = dict(cfg)
    sites = dict(cfg.pop("sites", None) or {})
    base = _merge(AttentionSpec(), cfg, where="attention")
    unknown = set(sites) - set(SITES)
    if unknown:
        raise AttentionConfigError(
            f"unknown attention site(s) {sorted(unknown)}; valid sites: {', '.join(SITES)}"
        )
    specs = {
        site: _merge(base, dict(sites.get(site) or {}), where=f"attention.sites.{site}") for site in SITES
    }
    return {site: _with_length(spec, max_positions) for site, spec in specs.items()}


def _with_length(spec: AttentionSpec, max_positions: int | None) -> AttentionSpec:
    """``spec`` with its kernel's length option set to ``max_positions`` where the config gave none."""
    option = kernel_class(spec.kernel).length_option
    if max_positions is None or option is None or option in spec.options:
        return spec
    return replace(spec, options={**spec.options, option: max_positions})


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


# --- RNN --------------------------------------------------------------------------------------------


def rnn_attention(cfg: Mapping[str, Any]) -> RNNAttentionSpec:
    """Resolve an RNN ``attention`` config: the mechanism's options are the keys its constructor takes,
    the remaining ones go to the decoder. A Transformer head layout (``num_kv_heads``) is refused."""
    check_family("rnn", cfg)
    options = {k: v for k, v in cfg.items() if k != "name"}
    num_kv_heads = options.pop("num_kv_heads", None)
    if num_kv_heads is not None:
        raise AttentionConfigError(
            f"num_kv_heads={num_kv_heads} sets a Transformer head layout (heads=gqa / heads=mqa), but "
            "the rnn model's attention has a single head: use heads=mha (the default)"
        )
    if "mechanism" not in options:
        raise AttentionConfigError(
            f"the rnn model needs attention.mechanism (got keys {sorted(options)}); "
            f"valid mechanisms: {', '.join(available_mechanisms())}"
        )
    mechanism = options.pop("mechanism")
    decoder = options.pop("decoder", None)
    own = set(mechanism_options(mechanism))
    return RNNAttentionSpec(
        decoder=decoder,
        mechanism=mechanism,
        mechanism_options={k: v for k, v in options.items() if k in own},
        decoder_options={k: v for k, v in options.items() if k not in own},
    )


# --- labels -----------------------------------------------------------------------------------------


def describe_attention(cfg: Mapping[str, Any]) -> str:
    """A one-line label of an ``attention`` config for tables and logs, from the kernels' and mechanisms'
    own descriptions: ``sdpa kv=2``, ``sparse sliding_window window=8 cross=eager``, ``luong general``."""
    if FAMILY_KEYS["rnn"] in cfg:
        spec = rnn_attention(cfg)
        return f"{spec.decoder} {mechanism_class(spec.mechanism).describe(spec.mechanism_options)}"
    specs = site_specs(cfg)
    first = specs[SITES[0]]
    parts = [_describe_site(first, shown_heads=None)]
    parts += [
        f"{site}={_describe_site(spec, shown_heads=first.num_kv_heads)}"
        for site, spec in specs.items()
        if spec != first
    ]
    return " ".join(parts)


def _describe_site(spec: AttentionSpec, *, shown_heads: int | None) -> str:
    """The kernel's own label, with the head layout unless it was already given (``shown_heads``)."""
    label = build_kernel(spec.kernel, **dict(spec.options)).describe()
    same_heads = spec.num_kv_heads is None or spec.num_kv_heads == shown_heads
    return label if same_heads else f"{label} kv={spec.num_kv_heads}"
