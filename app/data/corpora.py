"""A run's corpora, built once from ``data``: every split's examples with their directions and separator.

Two config axes change what a row of the corpora is, and this module is the one place that reads them:

* the direction axis (``data.directions``, ``data.pairs``): which language pairs the run learns and
  whether each source carries its target-language tag (:mod:`app.data.multilingual`);
* the concat axis (``data.concat=K``): an example is K consecutive sentence pairs joined by
  :data:`app.data.concat.SEPARATOR` (:mod:`app.data.concat`).

:class:`CorpusLayout` is that reading (no data); :class:`Corpora` is the data it describes. Every split is
the concatenation of its directions' examples, and its ``spans`` say which rows are whose. A plain
bilingual run is the degenerate case: one untagged direction (``src_lang-tgt_lang``) whose span is the
whole split. The datamodule, the LightningModule's validation and the test scoring all take these
objects, so adding a direction or changing the concat axis touches only this module and the loaders
it calls (:mod:`app.data.sources`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import datasets
import numpy as np

from app.data.concat import SEPARATOR, concat_pairs
from app.data.corpus import CorpusError, to_parallel_text
from app.data.multilingual import TAG_FORMAT, Languages, language_tag, parse_direction, tagged_split
from app.data.multilingual_corpus import direction_files
from app.data.sources import SPLIT_NAMES, Files, open_files, open_hub

Span = tuple[str, int, int]  # (direction, start, stop): the rows of one direction in a split


@dataclass(frozen=True)
class CorpusLayout:
    """What one example of the run's corpora is: its direction and how many sentences it joins.

    ``directions`` are in corpus order; an untagged (bilingual) run has the one ``src_lang-tgt_lang``.
    ``tagged`` runs put ``<2xx>`` (``tag_format``) before every source and score each direction on its own.
    """

    directions: tuple[str, ...]
    tagged: bool
    concat: int = 1
    tgt_lang: str | None = None  # the untagged run's target language (Moses tokenization of its scores)
    langs: tuple[str, ...] = ()  # every language read or written, sorted (what a fetcher prepares)
    tag_format: str = TAG_FORMAT  # data.tag_format: how a tagged run writes its target tags

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> CorpusLayout:
        """From the ``data`` config; refuses combinations the loaders cannot build, naming the keys."""
        languages = Languages.from_config({"data": data})
        concat = 1 if data.get("concat") is None else int(data["concat"])
        if concat < 1:
            raise ValueError(f"data.concat must be >= 1 (pairs per example), got {concat}")
        if languages.tagged and concat != 1:
            raise CorpusError("data.concat > 1 and data.directions cannot be combined (one or the other)")
        if languages.tagged and data.get("hub"):
            raise CorpusError("data.directions reads files (data.pairs or data.lang_files), not data.hub")
        if languages.tagged:
            langs = sorted({*languages.sources, *languages.targets})
            return cls(
                languages.directions, True, concat, langs=tuple(langs), tag_format=languages.tag_format
            )
        src, tgt = data.get("src_lang"), data.get("tgt_lang")
        langs = sorted({str(lang) for lang in (src, tgt) if lang})
        return cls((f"{src}-{tgt}",), tagged=False, concat=concat, tgt_lang=tgt, langs=tuple(langs))

    @property
    def separator(self) -> str | None:
        """The piece joining an example's sentences (None: one sentence an example)."""
        return SEPARATOR if self.concat > 1 else None

    @property
    def scored_directions(self) -> tuple[str, ...]:
        """The directions scored on their own (``val/bleu/de-en``); none for an untagged run, whose one
        direction is the whole set."""
        return self.directions if self.tagged else ()

    @property
    def scoring_lang(self) -> str | None:
        """The language of the whole set's references, for Moses-tokenized BLEU; None when each direction
        is scored with its own (a tagged run)."""
        return None if self.tagged else self.tgt_lang

    @property
    def symbols(self) -> list[str]:
        """Pieces the tokenizers must keep whole: every target tag of a tagged run, the separator."""
        tags = sorted({language_tag(parse_direction(d)[1], self.tag_format) for d in self.scored_directions})
        return [*tags, *([self.separator] if self.separator else [])]

    def subword_settings(self, subword: Mapping[str, Any]) -> dict[str, Any]:
        """The ``data.subword`` settings with :attr:`symbols` added as user-defined symbols."""
        symbols = list(subword.get("user_defined_symbols") or ())
        added = [symbol for symbol in self.symbols if symbol not in symbols]
        return {**subword, "user_defined_symbols": [*symbols, *added]} if symbols or added else dict(subword)


@dataclass(frozen=True)
class Split:
    """One split's examples (``src``, ``tgt`` and, tagged, ``direction``) and each direction's rows.

    ``scored_directions`` are the directions whose scores are reported on their own besides the mean
    over all (:attr:`CorpusLayout.scored_directions`: none for an untagged split, whose one span is all).
    """

    texts: datasets.Dataset
    spans: tuple[Span, ...]
    scored_directions: tuple[str, ...] = ()

    def __len__(self) -> int:
        return self.texts.num_rows

    @cached_property
    def sources(self) -> list[str]:
        """The source side as text (validation and test sets are small: materialised once)."""
        return to_parallel_text(self.texts).src

    @cached_property
    def references(self) -> list[str]:
        """The target side as text (validation and test sets are small: materialised once)."""
        return to_parallel_text(self.texts).tgt

    def direction_codes(self) -> tuple[np.ndarray, list[str]]:
        """Each row's direction as an integer (N,) in span order, and the names the integers stand for."""
        sizes = [stop - start for _, start, stop in self.spans]
        return np.repeat(np.arange(len(sizes)), sizes), [name for name, _, _ in self.spans]


@dataclass(frozen=True)
class Corpora:
    """The train, valid and test splits of a run as its :class:`CorpusLayout` describes them.

    ``train_sentences`` is the training split before ``data.concat`` joins it: the text an untagged run's
    sentencepiece models learn from.
    """

    layout: CorpusLayout
    splits: Mapping[str, Split]
    train_sentences: datasets.Dataset

    def __getitem__(self, split: str) -> Split:
        return self.splits[split]

    @classmethod
    def of_texts(cls, texts: Mapping[str, datasets.Dataset], layout: CorpusLayout | None = None) -> Corpora:
        """Splits already opened (``src`` / ``tgt`` examples) as the corpora of one untagged direction
        (``layout``: de-en by default); for tests and tools that build their texts in memory."""
        layout = layout or CorpusLayout(("de-en",), tagged=False, tgt_lang="en", langs=("de", "en"))
        if layout.tagged or len(layout.directions) != 1:
            raise ValueError(f"of_texts builds one untagged direction, not {layout}")
        return cls(layout, {name: joined(layout, [part]) for name, part in texts.items()}, texts["train"])

    def texts(self) -> dict[str, datasets.Dataset]:
        """Every split's example texts by name (what the datamodule encodes)."""
        return {name: split.texts for name, split in self.splits.items()}

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Corpora:
        """Open every direction's files (fetching them first if configured), tag tagged sources, join
        ``data.concat`` sentences per example, and concatenate the directions of each split in order."""
        layout = CorpusLayout.from_config(data)
        if data.get("hub"):  # one untagged direction (CorpusLayout refuses a tagged one)
            opened = {layout.directions[0]: open_hub(data)}
        else:
            opened = open_files(data, corpus_files(data, layout), layout.langs)
        if layout.tagged:  # {direction: {split: sentences}}, each source led by its target tag
            opened = {
                d: {s: tagged_split(pairs, d, layout.tag_format) for s, pairs in splits.items()}
                for d, splits in opened.items()
            }
        sentences = {split: [opened[d][split] for d in layout.directions] for split in SPLIT_NAMES}
        splits = {
            split: joined(layout, [concat_pairs(part, layout.concat) for part in parts])
            for split, parts in sentences.items()
        }
        return cls(layout, splits, joined(layout, sentences["train"]).texts)


def corpus_files(data: Mapping[str, Any], layout: CorpusLayout) -> Files:
    """Each direction's files, ``{direction: {split: {"src": path, "tgt": path}}}``: ``data.pairs`` or
    ``data.lang_files`` for a tagged run, ``data.files`` for the one direction of an untagged run."""
    if layout.tagged:
        return {direction: direction_files(data, direction) for direction in layout.directions}
    return {layout.directions[0]: {split: dict(data["files"][split]) for split in SPLIT_NAMES}}


def joined(layout: CorpusLayout, parts: Sequence[datasets.Dataset]) -> Split:
    """The parts of one split (one per direction, in ``layout.directions`` order), one after the
    other, and the span of each non-empty part."""
    stops = np.cumsum([part.num_rows for part in parts])
    spans = tuple(
        (direction, int(stop - part.num_rows), int(stop))
        for direction, part, stop in zip(layout.directions, parts, stops, strict=True)
        if part.num_rows
    )
    texts = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(list(parts))
    return Split(texts, spans, layout.scored_directions)
