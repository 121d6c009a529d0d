"""``data.concat=K``: long examples from K consecutive sentence pairs, and their scores split back."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from app.data.concat import SEPARATOR, concat_pairs, group_starts, split_at_separator
from app.data.corpora import CorpusLayout
from app.data.subword_training import train_or_load
from app.data.tokenizer import SubwordConfig
from app.inference.metrics import corpus_scores, joined_scores


def pairs(src: list[str], tgt: list[str]) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"src": src, "tgt": tgt})


def test_k_consecutive_pairs_become_one_example_on_both_sides() -> None:
    joined = concat_pairs(pairs(list("abcdefg"), list("ABCDEFG")), 3)
    assert joined["src"] == ["a <sep> b <sep> c", "d <sep> e <sep> f", "g"]
    assert joined["tgt"] == ["A <sep> B <sep> C", "D <sep> E <sep> F", "G"]


def test_a_blank_pair_ends_a_document_and_no_example_crosses_it() -> None:
    src = ["a", "b", "c", "", "d", "e", "f", "  ", "g"]
    tgt = ["A", "B", "C", " ", "D", "E", "F", "", "G"]
    joined = concat_pairs(pairs(src, tgt), 2)
    assert joined["src"] == ["a <sep> b", "c", "d <sep> e", "f", "g"]
    assert joined["tgt"] == ["A <sep> B", "C", "D <sep> E", "F", "G"]


def test_a_blank_side_alone_is_a_sentence_not_a_boundary() -> None:
    joined = concat_pairs(pairs(["a", "", "c"], ["A", "B", "C"]), 3)
    assert joined["src"] == ["a <sep>  <sep> c"] and joined["tgt"] == ["A <sep> B <sep> C"]
    assert split_at_separator(joined["src"][0]) == ["a", "", "c"]


def test_the_fingerprint_follows_from_the_input_and_k_without_hashing_the_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """datasets would fingerprint a new table by pickling it, which fails under Python 3.12 with
    pyarrow 26 (seen on the GPU machine); the grouping names its own, the cache key of later maps."""
    corpus, other = pairs(list("abcd"), list("ABCD")), pairs(list("abce"), list("ABCE"))

    def refuse(*args: object, **kwargs: object) -> str:
        raise AssertionError("the joined table was hashed")

    monkeypatch.setattr(datasets.arrow_dataset, "generate_fingerprint", refuse)
    first, again = concat_pairs(corpus, 2), concat_pairs(corpus, 2)
    assert first._fingerprint == again._fingerprint
    different = {concat_pairs(corpus, 3)._fingerprint, concat_pairs(other, 2)._fingerprint}
    assert first._fingerprint not in different and len(different) == 2


def test_k_of_one_is_the_corpus_itself_and_k_below_one_is_refused() -> None:
    corpus = pairs(["a", "b"], ["A", "B"])
    assert concat_pairs(corpus, 1) is corpus
    with pytest.raises(ValueError, match=r"data\.concat must be >= 1"):
        concat_pairs(corpus, 0)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_group_starts_restart_with_every_document(k: int) -> None:
    documents = [0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2]
    starts = group_starts(__import__("numpy").array(documents), k).tolist()
    expected, previous, position = [], None, 0
    for doc in documents:
        position = 0 if doc != previous else position + 1
        expected.append(position % k == 0)
        previous = doc
    assert starts == expected


def test_the_separator_is_one_piece_of_the_trained_tokenizer(tmp_path: Path) -> None:
    texts = [f"a small sentence number {i} about dogs and cats" for i in range(200)]
    joined = CorpusLayout.from_config({"src_lang": "x", "tgt_lang": "y", "concat": 4})
    settings = SubwordConfig(**joined.subword_settings({"vocab_size": 60, "model_type": "bpe"}))
    src, _ = train_or_load(
        src_texts=texts, tgt_texts=texts, config=settings, cache_dir=tmp_path, corpus_key="x-y"
    )
    ids = src.encode([f"dogs {SEPARATOR} cats"])[0]
    assert SEPARATOR in src.id_to_piece(ids)
    assert src.decode([ids])[0] == f"dogs {SEPARATOR} cats"
    single = CorpusLayout.from_config({"src_lang": "x", "tgt_lang": "y", "concat": 1})
    assert single.subword_settings({"vocab_size": 60}) == {"vocab_size": 60}  # K = 1: the settings unchanged


def test_joined_scores_ignore_separators_and_score_the_outputs_that_split_like_their_reference() -> None:
    references = [
        "a brown dog runs home <sep> a black cat sleeps inside",
        "two old men talk loudly <sep> a young boy reads books <sep> it rains all day",
    ]
    hypotheses = [references[0], "two old men talk loudly <sep> a young boy reads books it rains all day"]
    whole, split = joined_scores(hypotheses, references, SEPARATOR)
    stripped = [" ".join(split_at_separator(t)) for t in hypotheses]
    assert whole.bleu == corpus_scores(stripped, [" ".join(split_at_separator(t)) for t in references]).bleu
    assert (split.examples, split.matched, split.sentences) == (2, 1, 2)  # the second lost a separator
    assert split.scores is not None and split.scores.bleu == pytest.approx(100.0)
    assert split.rounded("test_")["test_split_matched"] == 1
    assert split.rounded("test_")["test_sentence_bleu"] == pytest.approx(100.0)
