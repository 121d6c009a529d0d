"""One model, many directions: language tags, the directions a model serves, and sampling across them.

Johnson et al. (2017), Section 3: a multilingual model is an ordinary encoder-decoder whose source
carries a token naming the target language, ``<2de> A man rides a bike.``. The tag is on the encoder
side, so decoding starts from BOS as in a bilingual model (a CTranslate2 export needs no
``target_prefix``), and a source language never seen with a target still gets one (zero-shot).
Each tag is a user-defined sentencepiece symbol (always one piece, never split), like
:data:`app.data.concat.SEPARATOR`.

Corpora of unequal size are mixed by temperature (Arivazhagan et al. 2019, Section 4.2): direction i with
n_i training pairs is drawn with probability p_i proportional to n_i ** (1 / T). T = 1 keeps the corpus
proportions (plain concatenation), T -> inf samples every direction equally often.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DIRECTION_COLUMN = "direction"  # which direction each row of a multilingual split belongs to
_DIRECTION = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)-([A-Za-z][A-Za-z0-9_]*)$")


class LanguageError(ValueError):
    """A direction or language the config or a request names wrongly, or that a model was not trained for."""


TAG_FORMAT = "<2{lang}>"  # data.tag_format's default; an imported OPUS-MT model's tags are ">>{lang}<<"


def language_tag(lang: str, tag_format: str = TAG_FORMAT) -> str:
    """The source-side token asking for ``lang`` as the output language: ``<2de>`` (or ``>>de<<``)."""
    return tag_format.replace("{lang}", lang)


def check_tag_format(value: Any) -> str:
    """``data.tag_format`` as given, after checking it makes one whitespace-free token per language."""
    if value is None:
        return TAG_FORMAT
    text = str(value)
    if text.count("{lang}") != 1 or any(c.isspace() for c in text) or text.replace("{lang}", "").count("{"):
        raise LanguageError(
            f"data.tag_format must hold {{lang}} once and no spaces, like <2{{lang}}> (ours) or >>{{lang}}<< "
            f"(OPUS-MT's), got {value!r}"
        )
    return text


def parse_direction(name: str) -> tuple[str, str]:
    """``"de-en"`` as ``("de", "en")``; anything else raises :class:`LanguageError`."""
    found = _DIRECTION.match(str(name))
    if not found or found.group(1) == found.group(2):
        raise LanguageError(f"direction {name!r} is not SRC-TGT with two different languages, e.g. de-en")
    return found.group(1), found.group(2)


def parse_directions(value: Any, languages: Sequence[str] | None = None) -> list[str] | None:
    """``data.directions`` as a list of ``"src-tgt"`` names; None stays None (one bilingual direction).

    ``"all"`` means every ordered pair of ``languages`` (``data.languages``).
    """
    if value is None:
        return None
    if value == "all":
        if not languages or len(languages) < 2:
            raise LanguageError(f"data.directions=all needs data.languages with two or more, got {languages}")
        return [f"{a}-{b}" for a in languages for b in languages if a != b]
    if isinstance(value, str) or not len(value):
        raise LanguageError(f"data.directions must be a list like [en-de, de-en], all or null, got {value!r}")
    names = [str(name) for name in value]
    for name in names:
        parse_direction(name)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise LanguageError(f"data.directions lists {repeated} more than once")
    return names


@dataclass(frozen=True)
class Languages:
    """The directions a model was trained on, and whether its sources carry target-language tags."""

    directions: tuple[str, ...]
    tagged: bool
    tag_format: str = TAG_FORMAT  # how a target language's tag is written (data.tag_format)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Languages:
        """From a run config (a checkpoint's or an export's): ``data.directions``, else the one direction."""
        data = config.get("data") or {}
        directions, tag_format = configured_directions(data), check_tag_format(data.get("tag_format"))
        if directions is None:
            src, tgt = data.get("src_lang"), data.get("tgt_lang")
            return cls((f"{src}-{tgt}",) if src and tgt and src != tgt else (), False, tag_format)
        return cls(tuple(directions), True, tag_format)

    @property
    def sources(self) -> list[str]:
        return sorted({parse_direction(d)[0] for d in self.directions})

    @property
    def targets(self) -> list[str]:
        return sorted({parse_direction(d)[1] for d in self.directions})

    def describe(self) -> str:
        return f"directions {', '.join(self.directions)} (target languages: {', '.join(self.targets)})"

    def tag(
        self, target_lang: str | None, source_lang: str | None = None, *, required: bool = True
    ) -> str | None:
        """The tag to prepend for ``target_lang`` (None for a bilingual model), after checking that the
        model knows both languages; a source language never trained into ``target_lang`` is allowed
        (zero-shot). A multilingual model needs ``target_lang`` unless not ``required`` (sources that
        carry their tags already: :meth:`tagged_sources` checks each)."""
        if target_lang is None:
            if self.tagged and required:
                raise LanguageError(self.name_the_target())
            return None
        if target_lang not in self.targets:
            raise LanguageError(
                f"target language {target_lang!r} is not one this model translates into; {self.describe()}"
            )
        known = sorted({*self.sources, *self.targets})
        if source_lang is not None and source_lang not in known:
            raise LanguageError(
                f"source language {source_lang!r} is not one this model was trained on ({', '.join(known)}); "
                f"{self.describe()}"
            )
        return language_tag(target_lang, self.tag_format) if self.tagged else None

    def tagged_sources(self, sentences: Sequence[str], target_lang: str | None) -> list[str]:
        """``sentences`` as the model reads them: ``target_lang``'s tag and a space before each non-blank
        one. With no ``target_lang``, a multilingual model's sentences must each start with one of its tags
        (how OPUS-MT's users write them, ``>>fra<< Text.``): they are taken as they are. Blank ones stay
        blank."""
        tag = self.tag(target_lang, required=False)
        if tag is not None:
            return [f"{tag} {s}" if s.strip() else s for s in sentences]
        if self.tagged:
            tags = {language_tag(lang, self.tag_format) for lang in self.targets}
            untagged = [
                n for n, s in enumerate(sentences, 1) if s.strip() and s.split(maxsplit=1)[0] not in tags
            ]
            if untagged:
                raise LanguageError(
                    f"sentence {untagged[0]} starts with none of the tags; {self.name_the_target()}"
                )
        return list(sentences)

    def name_the_target(self) -> str:
        """What a multilingual model asks of a request without a target language."""
        example = language_tag(self.targets[0], self.tag_format)
        return (
            f"this model translates into several languages, {self.describe()}: name the target language "
            f"(translate.py --tgt-lang, the server's target_lang) or start each sentence with its tag, "
            f"e.g. '{example} ...'"
        )


def configured_directions(data: Mapping[str, Any]) -> list[str] | None:
    """``data.directions`` resolved (``all`` against ``data.languages``); with ``data.pairs`` and no
    directions, the pairs' names. None: a bilingual run (``data.src_lang`` -> ``data.tgt_lang``)."""
    value = data.get("directions")
    if value is None and data.get("pairs"):
        value = list(data["pairs"])
    return parse_directions(value, data.get("languages"))


def tagged_split(dataset: datasets.Dataset, direction: str, tag_format: str = TAG_FORMAT) -> datasets.Dataset:
    """``dataset``'s pairs with the target tag before each non-blank source, and a ``direction`` column.

    A blank source stays blank (nothing to translate, as in translate.py). A corpus read from files is
    tagged through ``Dataset.map`` into ``datasets``' cache beside it (memory-mapped, made once); an
    in-memory one stays in memory.
    """
    return (
        dataset.with_format("arrow")
        .map(
            _tag_batch,
            batched=True,
            batch_size=10_000,
            fn_kwargs={"direction": direction, "tag_format": tag_format},
            desc=f"tagging {direction}",
        )
        .with_format(None)
    )


def _tag_batch(batch: pa.Table, direction: str, tag_format: str) -> pa.Table:
    """One batch of :func:`tagged_split`: Arrow string kernels, no Python strings per row."""
    tag = language_tag(parse_direction(direction)[1], tag_format)
    src = batch["src"].combine_chunks()
    blank = pc.equal(pc.utf8_trim_whitespace(src), "")
    tagged = pc.if_else(blank, src, pc.binary_join_element_wise(f"{tag} ", src, ""))
    name = pa.array([direction] * len(src), pa.string())
    return pa.table({"src": tagged, "tgt": batch["tgt"], DIRECTION_COLUMN: name})


def temperature_probabilities(sizes: Sequence[int], temperature: float) -> np.ndarray:
    """p_i proportional to n_i ** (1 / T) (Arivazhagan et al. 2019): T = 1 proportional, large T uniform."""
    if not temperature > 0:
        raise LanguageError(f"data.sampling_temperature must be > 0, got {temperature}")
    counts = np.asarray(sizes, dtype=np.float64)
    weights = np.where(counts > 0, counts ** (1.0 / temperature), 0.0)
    if weights.sum() == 0:
        raise LanguageError(f"no training pairs to sample from: {list(sizes)}")
    return weights / weights.sum()


def temperature_rows(rows: np.ndarray, groups: np.ndarray, temperature: float, seed: int) -> np.ndarray:
    """The training rows an epoch draws: ``len(rows)`` in all, direction i getting p_i of them.

    ``groups`` (len(rows),) names each row's direction. A direction above its share gives a random
    subset (without replacement); one below it repeats all its rows, then a random subset for the rest.
    T = 1 returns ``rows`` unchanged. The draw is fixed by ``seed`` (so resuming sees the same rows).
    """
    rows, groups = np.asarray(rows, dtype=np.int64), np.asarray(groups)
    if temperature == 1 or not len(rows):
        return rows
    names, inverse = np.unique(groups, return_inverse=True)
    sizes = np.bincount(inverse, minlength=len(names))
    wanted = np.floor(temperature_probabilities(sizes, temperature) * len(rows)).astype(np.int64)
    wanted[np.argmax(wanted)] += len(rows) - wanted.sum()  # the rounding remainder, to the largest share
    rng = np.random.default_rng(seed)
    drawn = []
    for group, want in enumerate(wanted):
        members = rows[inverse == group]
        repeats, rest = divmod(int(want), len(members))
        drawn.append(np.tile(members, repeats))
        drawn.append(np.sort(rng.choice(members, size=rest, replace=False)))
    return np.concatenate(drawn)
