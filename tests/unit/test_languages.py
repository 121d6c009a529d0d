"""Directions, language tags and temperature sampling (app/data/multilingual.py), without training."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest

from app.data.corpora import CorpusLayout
from app.data.multilingual import (
    LanguageError,
    Languages,
    language_tag,
    parse_directions,
    tagged_split,
    temperature_probabilities,
)
from app.inference.selection import check_selection, validation_monitor
from app.reports.runs import RunRecord
from app.reports.summary import COLUMNS, summary_table


def test_directions_parse_from_a_list_or_all() -> None:
    assert parse_directions(None) is None
    assert parse_directions(["en-de", "de-en"]) == ["en-de", "de-en"]
    assert parse_directions("all", ["en", "de", "fr"]) == [
        "en-de",
        "en-fr",
        "de-en",
        "de-fr",
        "fr-en",
        "fr-de",
    ]
    for bad in (["en_de"], ["en-en"], "en-de", ["en-de", "en-de"]):
        with pytest.raises(LanguageError):
            parse_directions(bad)
    with pytest.raises(LanguageError, match=r"data\.languages"):
        parse_directions("all", None)


def test_tags_become_user_defined_symbols_once() -> None:
    subword = {"vocab_size": 100, "user_defined_symbols": ["<sep>"]}
    tagged = CorpusLayout.from_config({"directions": ["en-de", "fr-de", "de-en"]})
    assert tagged.subword_settings(subword)["user_defined_symbols"] == ["<sep>", "<2de>", "<2en>"]
    untagged = CorpusLayout.from_config({"src_lang": "de", "tgt_lang": "en", "directions": None})
    assert untagged.subword_settings(subword) == subword and untagged.symbols == []


def test_a_multilingual_model_needs_a_target_it_knows_and_names_its_languages() -> None:
    languages = Languages.from_config({"data": {"directions": ["en-de", "de-en", "en-fr"]}})
    assert languages.tagged and languages.targets == ["de", "en", "fr"]
    assert languages.tag("fr") == "<2fr>" == language_tag("fr")
    assert languages.tag("fr", "de") == "<2fr>"  # de->fr was never trained: zero-shot is allowed
    with pytest.raises(LanguageError, match="en-de, de-en, en-fr"):
        languages.tag(None)
    with pytest.raises(LanguageError, match=r"'cs' is not one.*target languages: de, en, fr"):
        languages.tag("cs")
    with pytest.raises(LanguageError, match="source language 'cs'"):
        languages.tag("de", "cs")


def test_a_bilingual_model_is_untagged_and_checks_a_named_target() -> None:
    languages = Languages.from_config({"data": {"src_lang": "de", "tgt_lang": "en", "directions": None}})
    assert not languages.tagged and languages.directions == ("de-en",)
    assert languages.tag(None) is None and languages.tag("en") is None
    with pytest.raises(LanguageError, match="de-en"):
        languages.tag("fr")


def test_tagging_keeps_blank_sources_blank() -> None:
    pairs = datasets.Dataset.from_dict({"src": ["A dog.", "", "  "], "tgt": ["Ein Hund.", "", ""]})
    split = tagged_split(pairs, "en-de")
    assert split["src"] == ["<2de> A dog.", "", "  "] and split["tgt"] == pairs["tgt"]
    assert split["direction"] == ["en-de"] * 3 and "direction" not in pairs.column_names
    languages = Languages.from_config({"data": {"directions": ["en-de"]}})
    assert languages.tagged_sources(["A dog.", ""], "de") == ["<2de> A dog.", ""]


def test_sentences_that_bring_their_tags_need_no_target_language() -> None:
    languages = Languages.from_config({"data": {"directions": ["en-de", "en-fr"]}})
    given = ["<2fr> A dog.", "", "  <2de> A cat."]
    assert languages.tagged_sources(given, None) == given  # taken as they are
    with pytest.raises(LanguageError, match=r"sentence 2 starts with none of the tags.*'<2de> \.\.\.'"):
        languages.tagged_sources(["<2fr> A dog.", "<2cs> A cat."], None)
    assert languages.tag(None, required=False) is None
    bilingual = Languages.from_config({"data": {"src_lang": "en", "tgt_lang": "de"}})
    assert bilingual.tagged_sources(["<2fr> x", "y"], None) == ["<2fr> x", "y"]  # no tags: text as given


def test_tag_format_writes_the_tags_of_a_run_and_of_its_model() -> None:
    data = {"directions": ["en-fra", "en-pt_BR"], "tag_format": ">>{lang}<<"}
    languages = Languages.from_config({"data": data})
    assert languages.tag("pt_BR") == ">>pt_BR<<" == language_tag("pt_BR", ">>{lang}<<")
    assert languages.tagged_sources(["A dog."], "fra") == [">>fra<< A dog."]
    assert languages.tagged_sources([">>pt_BR<< A dog."], None) == [">>pt_BR<< A dog."]
    layout = CorpusLayout.from_config(data)
    assert layout.symbols == [">>fra<<", ">>pt_BR<<"]
    pairs = datasets.Dataset.from_dict({"src": ["A dog.", ""], "tgt": ["Un chien.", ""]})
    assert tagged_split(pairs, "en-fra", layout.tag_format)["src"] == [">>fra<< A dog.", ""]
    for bad in ("<2>", "{lang}{lang}", "< {lang} >", "<{lang}{x}>"):
        with pytest.raises(LanguageError, match=r"data\.tag_format"):
            Languages.from_config({"data": {"directions": ["en-de"], "tag_format": bad}})


def test_temperature_goes_from_proportional_to_uniform() -> None:
    sizes = [900, 100]
    assert np.allclose(temperature_probabilities(sizes, 1), [0.9, 0.1])
    assert np.allclose(temperature_probabilities(sizes, 2), [0.75, 0.25])  # sqrt: 30 : 10
    assert np.allclose(temperature_probabilities(sizes, 1e6), [0.5, 0.5], atol=1e-4)
    with pytest.raises(LanguageError, match="> 0"):
        temperature_probabilities(sizes, 0)


def test_the_run_summary_shows_each_direction_under_the_mean() -> None:
    results = {
        "parameters": 1_000_000,
        "test_bleu": 30.0,
        "test_bleu_lc": 31.0,
        "test_chrf": 50.0,
        "test_directions": ["de-en", "en-fr"],
        "test_bleu/de-en": 35.0,
        "test_bleu_lc/de-en": 36.0,
        "test_chrf/de-en": 55.0,
        "test_bleu/en-fr": 25.0,
        "test_bleu_lc/en-fr": 26.0,
        "test_chrf/en-fr": 45.0,
    }
    run = RunRecord(Path("runs/ml"), {"model": {}, "attention": {}}, [], results, "")
    rows = summary_table([run]).rows
    assert [row[0] for row in rows] == ["ml", "ml de-en", "ml en-fr"]
    bleu = COLUMNS.index("BLEU")
    assert [row[bleu] for row in rows] == ["30.00", "35.00", "25.00"]
    bilingual = RunRecord(
        Path("runs/bi"), {"model": {}, "attention": {}}, [], results | {"test_directions": []}, ""
    )
    assert len(summary_table([bilingual]).rows) == 1


def test_selection_may_follow_one_named_direction() -> None:
    config = {"data": {"directions": ["en-de", "de-en"]}, "selection": {"direction": "en-de"}}
    check_selection(config)
    assert validation_monitor(config) == "val/bleu/en-de"
    assert validation_monitor({"selection": {"metric": "bleu_lc"}}) == "val/bleu_lc"
    with pytest.raises(ValueError, match="en-de, de-en"):
        check_selection({**config, "selection": {"direction": "fr-en"}})
    with pytest.raises(ValueError, match="bilingual"):
        check_selection({"data": {"src_lang": "de", "tgt_lang": "en"}, "selection": {"direction": "de-en"}})
