"""What an ablation report measures beyond the runs' own results: KV-cache bytes and attention maps
(decoding speed: :mod:`app.reports.decode_speed`).

The KV-cache size comes from each kernel's own accounting. The attention maps are drawn from the first
seed's best checkpoint, for short test sentences only (:func:`attention_skipped`), and cached beside the
report (``attention_maps.json``) so that a regenerated report, or one made from a copy of the sweep
without its checkpoints, is identical.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from app.attention.config import site_specs
from app.attention.registry import build_kernel
from app.inference.engine import AttentionMap, SearchSettings
from app.inference.engines import open_engine
from app.reports.variants import Group, Variant

# The output length over which the decoder cache's growth per generated token is averaged: kernels that
# keep a window (sparse) or a fixed-size state (linear) grow less per token the longer the output.
KV_LENGTH = 64
WEIGHT_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}
ATTENTION_CACHE = "attention_maps.json"
ATTENTION_SENTENCE = 0  # the test sentence (0-based line) whose cross-attention every variant draws
ATTENTION_MAX_WORDS = 64  # longer test sentences get no map: unreadable, and each variant decodes it


def kv_cache_bytes_per_token(
    model: dict[str, Any], attention: dict[str, Any], precision: str | None = None, length: int = KV_LENGTH
) -> int | None:
    """Decoder self-attention cache bytes per generated token, summed over the decoder layers: the
    kernel's own :meth:`~app.attention.base.AttentionKernel.cache_bytes` after ``length`` tokens, divided
    by ``length``. The cache holds the weights' dtype (fp32 unless ``precision`` is a ``*-true`` half
    one: mixed precision keeps fp32 weights, and test decoding runs without autocast). None for models
    without one (RNNs)."""
    if model.get("family", "transformer") != "transformer":
        return None
    spec = site_specs(attention)["decoder_self"]
    kernel = build_kernel(spec.kernel, **spec.options)
    heads = int(model["num_heads"])
    per_layer = kernel.cache_bytes(
        length,
        num_kv_heads=spec.num_kv_heads or heads,
        head_dim=int(model["d_model"]) // heads,
        dtype=WEIGHT_DTYPES.get(str(precision), torch.float32),
    )
    return round(int(model["decoder_layers"]) * per_layer / length)


def cache_key(runs: dict[str, Path], cache_dir: Path) -> str:
    """A measurement cache's key: each variant's run directory, relative to the cache's directory where
    it lies inside it, so a sweep directory copied elsewhere (without its checkpoints) still finds its
    measurements."""
    return json.dumps({name: os.path.relpath(path, cache_dir) for name, path in runs.items()}, sort_keys=True)


def attention_panels(variants: list[Variant], sentence: str) -> dict[str, AttentionMap | str]:
    """Each variant's cross-attention on ``sentence``: greedy output of the best checkpoint of its first
    seed, last decoder layer, mean over heads; a note instead where there is no checkpoint or no weights
    (approximate kernels such as linear compute none)."""
    panels: dict[str, AttentionMap | str] = {}
    for variant in variants:
        checkpoint = variant.runs[0].files.best  # runs are sorted by seed
        if not checkpoint.is_file():
            panels[variant.name] = "no checkpoint"
            continue
        engine = open_engine(checkpoint, engine="torch")
        try:
            [panels[variant.name]] = engine.attention_maps([sentence], SearchSettings(beam=1))
        except ValueError:  # Seq2Seq.cross_attention: the kernel approximates attention
            panels[variant.name] = "no weights"
    return panels


def panel_to_json(panel: AttentionMap | str) -> Any:
    """An attention map as JSON (weights rounded to 4 decimals), or the note that stands in for one."""
    if isinstance(panel, str):
        return panel
    weights = [[round(float(w), 4) for w in row] for row in panel.weights.tolist()]
    return {"translation": panel.translation, "source_tokens": panel.source_tokens,
            "target_tokens": panel.target_tokens, "weights": weights}  # fmt: skip


def panel_from_json(stored: Any) -> AttentionMap | str:
    """The inverse of :func:`panel_to_json` (the weights as stored, rounded)."""
    if isinstance(stored, str):
        return stored
    return AttentionMap(
        stored["translation"],
        stored["source_tokens"],
        stored["target_tokens"],
        torch.tensor(stored["weights"]),
    )


def cached_attention_panels(
    variants: list[Variant], sentence: str, cache: Path, *, remeasure: bool
) -> dict[str, AttentionMap | str]:
    """:func:`attention_panels`, stored in ``cache`` so that a report regenerated later (or from a copy
    of the sweep without checkpoints) draws the same figure; drawn from the stored, rounded maps always,
    so the first report and every later one are identical."""
    key = cache_key({v.name: v.runs[0].path for v in variants}, cache.parent) + f" | {sentence}"
    stored = json.loads(cache.read_text()) if cache.is_file() else {}
    if key not in stored or remeasure:
        panels = attention_panels(variants, sentence)
        if all(isinstance(panel, str) for panel in panels.values()):
            return panels  # nothing measured: keep whatever the cache holds
        stored[key] = {name: panel_to_json(panel) for name, panel in panels.items()}
        cache.write_text(json.dumps(stored, sort_keys=True) + "\n")
    return {name: panel_from_json(panel) for name, panel in stored[key].items()}


def attention_skipped(k: int, sentence: str) -> str | None:
    """Why the group's attention maps are not drawn, or None when they are: only for single sentences
    (``data.concat`` = 1) of at most :data:`ATTENTION_MAX_WORDS` words. A map of a K=64 example would be
    ~1,500 x 1,000 cells, and drawing it means decoding that example with every variant."""
    if k > 1:
        return f"not drawn for examples of {k} joined sentence pairs (drawn for single sentences only)"
    words = len(sentence.split())
    if words > ATTENTION_MAX_WORDS:
        line = ATTENTION_SENTENCE + 1
        return f"not drawn: test sentence {line} has {words} words (at most {ATTENTION_MAX_WORDS})"
    return None


def group_attention(
    group: Group, sources: list[str] | None, cache: Path, *, remeasure: bool = False
) -> tuple[str, dict[str, AttentionMap | str]] | None:
    """The fixed test sentence (:data:`ATTENTION_SENTENCE`) and every variant's attention map on it; None
    without test sources, or without any checkpoint or cached map to draw."""
    if sources is None or len(sources) <= ATTENTION_SENTENCE:
        return None
    sentence = sources[ATTENTION_SENTENCE]
    panels = cached_attention_panels(group.variants, sentence, cache, remeasure=remeasure)
    if all(isinstance(panel, str) for panel in panels.values()):
        return None
    return sentence, panels
