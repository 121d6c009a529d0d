"""Attention maps over HTTP: which requests may ask for them (``"attention": true``) and their JSON.

A map is the cross-attention of a sentence's best translation, read as ``translate.py --plot-attention``
reads it (:meth:`~app.inference.engine.Engine.attention_maps`: search, then teacher forcing). Each map
is (output pieces x source pieces) numbers, so few sentences may ask at once; only engines with weights
(the torch engine) answer, and only for searched best translations (no ``nbest``, no ``sample``).
"""

from __future__ import annotations

from app.inference.engine import AttentionMap, Engine
from app.serving.schema import MAX_ATTENTION_SENTENCES, AttentionMapBody, TranslateRequest

DIGITS = 4  # weights are rounded: 4 decimals draw any map, and keep the JSON small


def attention_problem(request: TranslateRequest, engine: Engine) -> str | None:
    """Why ``request`` may not have its attention maps (answered 422), or None when it may."""
    if not request.attention:
        return None
    if not engine.has_attention_maps:
        return (
            f"attention: the {engine.name} engine has no attention weights for this model (CTranslate2 "
            "exports have none, nor kernels that approximate attention: linear, linformer)"
        )
    if len(request.sentences) > MAX_ATTENTION_SENTENCES:
        return (
            f"attention: {len(request.sentences)} sentences is over the limit of {MAX_ATTENTION_SENTENCES} "
            "maps per request"
        )
    if request.sample is not None or request.nbest > 1:
        return "attention: maps are read for the best searched translation; drop sample and nbest"
    return None


def map_body(attention: AttentionMap | None) -> AttentionMapBody | None:
    """The JSON of one map (None stays None: a blank sentence has no map)."""
    if attention is None:
        return None
    weights = [[round(w, DIGITS) for w in row] for row in attention.weights.tolist()]  # (T, S)
    return AttentionMapBody(
        source_tokens=attention.source_tokens, target_tokens=attention.target_tokens, weights=weights
    )
