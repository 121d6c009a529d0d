"""Attention converted on a trained model: another head layout or kernel, taken at ``init_from`` time.

A warm start (``init_from=CKPT``, app/training/warm_start.py) builds the model this run's config names and
fills it with the checkpoint's weights. Where the two differ only in attention, :func:`convert_state`
turns the checkpoint's weights into ones the new model takes, layer by layer:

* **Head layout** (``heads=gqa|mqa``, ``heads.num_kv_heads=G``): the key and value projections of the
  heads that will share one key/value head are mean-pooled into it (Ainslie et al. 2023, "GQA", section
  2.1: "the key and value projection matrices of all heads are mean pooled"). Query head i uses kv head
  i // (H / G) (:func:`app.attention.base.repeat_kv`), so group g averages the trained heads
  g*r .. g*r + r - 1, r = Hkv / G: exactly the heads whose queries it now serves. Going the other way
  (fewer kv heads to more) repeats each head, which changes nothing. Query and output projections keep
  their shapes and are copied.
* **Kernels without parameters** (sdpa, flash, sparse patterns, linear, lsh): the projections are taken
  as they are; only the way softmax(QK^T)V is computed changes. Each kernel says what that means for it
  (:meth:`~app.attention.base.AttentionKernel.start_from_softmax`): our linear kernel's feature maps are
  fixed (elu + 1, FAVOR+ random features), not learned, so there is no T2R map (Kasai et al. 2021) to fit.
* **Kernels with parameters** (linformer's E and F): set by the kernel's own rule so that the converted
  layer starts as close to the trained softmax layer as the kernel allows (linformer: exactly it for
  inputs of up to ``k`` tokens; app/attention/kernels/linformer.py says why).
* **Shared-QK** (lsh ``shared_qk=true``, Kitaev et al. 2020 section 2): such a layer has no key
  projection (its keys are its unit-length queries), so a trained one is dropped and said so;
  ``attention.shared_qk=false`` keeps it. From a shared-QK model to one with keys, the new key projection
  is the query projection (pooled to the kv heads): the keys the trained model attended were its queries.

A change in anything else (the query heads, the model width, a kernel's settings that change its
parameters' shapes where the kernel cannot set them) is left to the load that follows, which refuses it.
What was done is returned as one line per tensor kind, for the log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torch import Tensor, nn

from app.attention.multihead import MultiHeadAttention
from app.attention.registry import AttentionConfigError

GQA_SOURCE = "Ainslie et al. 2023, section 2.1"


@dataclass
class Conversion:
    """A state dict the new model takes, and what was done to make it, by tensor kind."""

    state: dict[str, Tensor]
    done: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (kind, action) -> names

    def record(self, name: str, kind: str, action: str) -> None:
        """Note that tensor (or layer) ``name``, of ``kind`` (e.g. ``k_proj.weight``), had ``action``."""
        self.done.setdefault((kind, action), []).append(name)

    def notes(self) -> list[str]:
        """One line per tensor kind and action: the kind, where (layers as ``*``), how many, what."""
        lines = []
        for (kind, action), names in self.done.items():
            sites = sorted({re.sub(r"\.\d+(?=\.|$)", ".*", name[: -len(kind)].rstrip(".")) for name in names})
            count = f"{len(names)} tensors" if kind != "kernel" else f"{len(names)} layers"
            lines.append(f"{kind} at {', '.join(sites)} ({count}): {action}")
        touched = {name for names in self.done.values() for name in names}
        if lines:
            kept = sum(1 for name in self.state if name not in touched)
            lines.append(f"the other {kept} tensors: copied as they are")
        return lines


def convert_state(source: nn.Module, target: nn.Module) -> Conversion:
    """``source``'s weights as a state dict for ``target``, its attention layers converted where their head
    layout or kernel differ (see the module docstring); layers that match are copied unchanged.

    Raises :class:`~app.attention.registry.AttentionConfigError` for a head layout no pooling reaches
    (neither kv-head count divides the other).
    """
    conversion = Conversion(state=dict(source.state_dict()))
    trained = dict(source.named_modules())
    for name, layer in target.named_modules():
        old = trained.get(name)
        if not isinstance(layer, MultiHeadAttention) or not isinstance(old, MultiHeadAttention):
            continue
        if (old.num_heads, old.head_dim) != (layer.num_heads, layer.head_dim):
            continue  # not a conversion: the load refuses it, naming the config keys that differ
        prefix = f"{name}." if name else ""
        convert_heads(old, layer, prefix, conversion)
        convert_kernel(old, layer, prefix, conversion)
    return conversion


def regroup(tensor: Tensor, heads_from: int, heads_to: int, head_dim: int) -> Tensor:
    """A key/value projection's weight (Hkv*Dh, D) or bias (Hkv*Dh,) with ``heads_from`` heads, as one with
    ``heads_to``: each group of heads_from / heads_to consecutive heads mean-pooled into one, or each head
    repeated heads_to / heads_from times."""
    rows = tensor.reshape(heads_from, head_dim, *tensor.shape[1:])  # (Hkv, Dh[, D])
    if heads_from % heads_to == 0:
        rows = rows.unflatten(0, (heads_to, heads_from // heads_to)).mean(1)  # (G, Dh[, D])
    elif heads_to % heads_from == 0:
        rows = rows.repeat_interleave(heads_to // heads_from, dim=0)
    else:
        raise AttentionConfigError(
            f"cannot convert {heads_from} key/value heads to {heads_to}: one count must divide the other "
            f"(mean-pool groups of heads, or repeat heads); choose heads.num_kv_heads among the divisors "
            f"of {heads_from} or its multiples"
        )
    return rows.reshape(heads_to * head_dim, *tensor.shape[1:]).contiguous()


def convert_heads(
    old: MultiHeadAttention, new: MultiHeadAttention, prefix: str, conversion: Conversion
) -> None:
    """The key and value projections of ``old`` regrouped for ``new``'s kv heads, dropped for a shared-QK
    ``new``, or (keys of a shared-QK ``old``) taken from its query projection."""
    state, dim = conversion.state, old.head_dim
    for proj in ("k_proj", "v_proj"):
        mine, theirs = getattr(new, proj), getattr(old, proj)
        if mine is None and theirs is not None:
            for leaf in theirs.state_dict():
                del state[f"{prefix}{proj}.{leaf}"]
                conversion.record(
                    f"{prefix}{proj}.{leaf}",
                    f"{proj}.{leaf}",
                    f"dropped: {new.kernel.describe()} shares queries and keys (keys = unit-length queries, "
                    "Kitaev et al. 2020, section 2), so the trained key projection has no place; "
                    "attention.shared_qk=false keeps it",
                )
        elif mine is not None and theirs is None:
            for leaf, tensor in old.q_proj.state_dict().items():
                state[f"{prefix}{proj}.{leaf}"] = regroup(tensor, old.num_heads, new.num_kv_heads, dim)
                conversion.record(
                    f"{prefix}{proj}.{leaf}",
                    f"{proj}.{leaf}",
                    f"new, from q_proj.{leaf} ({old.num_heads} -> {new.num_kv_heads} heads): the trained "
                    "shared-QK layer's keys were its queries",
                )
        elif mine is not None and old.num_kv_heads != new.num_kv_heads:
            how = "mean-pooled per group" if old.num_kv_heads > new.num_kv_heads else "each head repeated"
            for leaf in theirs.state_dict():
                key = f"{prefix}{proj}.{leaf}"
                state[key] = regroup(state[key], old.num_kv_heads, new.num_kv_heads, dim)
                conversion.record(
                    key,
                    f"{proj}.{leaf}",
                    f"{how}, {old.num_kv_heads} -> {new.num_kv_heads} key/value heads ({GQA_SOURCE})",
                )


def convert_kernel(
    old: MultiHeadAttention, new: MultiHeadAttention, prefix: str, conversion: Conversion
) -> None:
    """Where the kernel changed: ``old``'s kernel parameters that ``new`` has no place for dropped, and
    ``new``'s own parameters set by its rule (``AttentionKernel.start_from_softmax``)."""
    theirs = {name: tensor.shape for name, tensor in old.kernel.state_dict().items()}
    mine = {name: tensor.shape for name, tensor in new.kernel.state_dict().items()}
    if type(old.kernel) is type(new.kernel) and theirs == mine:
        return  # the same kernel, its parameters (if any) fit: copied, whatever other settings changed
    state, change = conversion.state, f"{old.kernel.describe()} -> {new.kernel.describe()}"
    for name in theirs:
        del state[f"{prefix}kernel.{name}"]
        conversion.record(f"{prefix}kernel.{name}", f"kernel.{name}", f"dropped ({change})")
    rule = new.kernel.start_from_softmax()
    if not mine:
        conversion.record(f"{prefix}kernel", "kernel", f"{change}: {rule}")
    for name, tensor in new.kernel.state_dict().items():
        state[f"{prefix}kernel.{name}"] = tensor.detach().clone()
        conversion.record(f"{prefix}kernel.{name}", f"kernel.{name}", f"new ({change}): {rule}")
