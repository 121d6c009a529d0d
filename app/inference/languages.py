"""Translating in any trained direction: the target-language tag in front of each source.

A multilingual model (``data.directions``) reads ``<2fr> A man rides a bike.`` and answers in French
(:mod:`app.data.multilingual`). :class:`TaggedEngine` wraps any engine (torch or CTranslate2) so that
callers ask by language, ``settings.target_lang = "fr"``: it prepends that tag to every non-blank
sentence and hands the rest to the engine it wraps; with no target language, each sentence must start
with a tag of its own (``>>fra<< Text.``, as an imported OPUS-MT model's users write it). Requests with
different target languages are different settings, so the server's batcher never merges them. A
bilingual model is never wrapped.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from app.data.multilingual import Languages
from app.inference.engine import AttentionMap, Engine, SearchSettings, Translation, Truncated


class TaggedEngine(Engine):
    """A multilingual model's engine: ``settings.target_lang`` chooses the tag put before each source."""

    def __init__(self, engine: Engine, languages: Languages) -> None:
        self.engine, self.languages = engine, languages
        self.name, self.source = engine.name, engine.source
        self.max_source_tokens = engine.max_source_tokens
        self.tgt_tokenizer = engine.tgt_tokenizer
        self.has_attention_maps = engine.has_attention_maps

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def compile_report(self) -> str | None:
        return self.engine.compile_report()

    def untag(self, sentences: list[str], settings: SearchSettings) -> tuple[list[str], SearchSettings]:
        """The tagged sentences and the settings the wrapped engine gets (no language: it has none).
        Without a target language each sentence must bring its own tag (:meth:`Languages.tagged_sources`)."""
        texts = self.languages.tagged_sources(sentences, settings.target_lang)
        return texts, replace(settings, target_lang=None)

    def translate(
        self, sentences: list[str], settings: SearchSettings, on_truncate: Truncated | None = None
    ) -> list[str]:
        return self.engine.translate(*self.untag(sentences, settings), on_truncate)

    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        return self.engine.translate_nbest(*self.untag(sentences, settings), on_truncate, details=details)

    def attention_maps(
        self,
        sentences: list[str],
        settings: SearchSettings,
        *,
        layer: int | None = None,
        head: int | None = None,
        on_truncate: Truncated | None = None,
    ) -> list[AttentionMap | None]:
        texts, inner = self.untag(sentences, settings)
        return self.engine.attention_maps(texts, inner, layer=layer, head=head, on_truncate=on_truncate)


def with_languages(engine: Engine, languages: Languages, *, sources_tagged: bool = False) -> Engine:
    """``engine`` knowing its languages; a multilingual one wrapped in :class:`TaggedEngine` unless its
    sources come tagged already (the corpora of a training run: validation and test scoring)."""
    engine.languages = languages
    if not languages.tagged or sources_tagged:
        return engine
    return TaggedEngine(engine, languages)
