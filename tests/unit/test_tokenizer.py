"""Tests for app.data.tokenizer on real Multi30k sentences (the committed test corpus)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sentencepiece as spm
from helpers.training import read_gz_lines

from app.data import tokenizer as tokenizer_module
from app.data.subword_training import train_or_load
from app.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    SubwordConfig,
    Tokenizer,
    TokenizerError,
    settings_from_config,
)

SLICE = 2000
SMALL = SubwordConfig(vocab_size=500)
TINY = SubwordConfig(vocab_size=200)  # for tests that train several models: fast on a 500-line slice


@pytest.fixture(scope="module")
def texts(multi30k_dir: Path) -> tuple[list[str], list[str]]:
    de, en = (read_gz_lines(multi30k_dir / f"train.{lang}.gz", SLICE) for lang in ("de", "en"))
    return de, en


@pytest.fixture(scope="module")
def joint(texts: tuple[list[str], list[str]], tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    src, tgt = texts
    tokenizer, _ = train_or_load(
        src_texts=src,
        tgt_texts=tgt,
        config=SMALL,
        cache_dir=tmp_path_factory.mktemp("spm"),
        corpus_key="m30k",
    )
    return tokenizer


@pytest.fixture
def count_trainings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count calls of sentencepiece training made by train_or_load."""
    calls: list[int] = []
    original = spm.SentencePieceTrainer.train

    def counting_train(*args: object, **kwargs: object) -> None:
        calls.append(1)
        original(*args, **kwargs)

    monkeypatch.setattr(tokenizer_module.spm.SentencePieceTrainer, "train", counting_train)
    return calls


def test_round_trip_and_fixed_special_ids(joint: Tokenizer, texts: tuple[list[str], list[str]]) -> None:
    sample = texts[0][:50] + texts[1][:50]
    ids = joint.encode(sample)
    assert joint.decode(ids) == [" ".join(text.split()) for text in sample]  # nmt_nfkc trims spaces only
    assert all(BOS_ID not in seq and EOS_ID not in seq and PAD_ID not in seq for seq in ids)
    assert (
        (joint.pad_id, joint.unk_id, joint.bos_id, joint.eos_id)
        == (0, 1, 2, 3)
        == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    )
    assert joint.id_to_piece([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert joint.vocab_size == 500


def test_decode_skips_specials_and_out_of_range(joint: Tokenizer) -> None:
    (ids,) = joint.encode(["A dog runs."])
    noisy = [BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID, joint.vocab_size, joint.vocab_size + 7, -1]
    assert joint.decode([noisy, [PAD_ID, EOS_ID]]) == ["A dog runs.", ""]


def test_bytes_round_trip(joint: Tokenizer) -> None:
    restored = Tokenizer.from_bytes(joint.to_bytes())
    sentences = ["Ein Mann fährt Fahrrad.", "Two children play in the snow."]
    assert restored.encode(sentences) == joint.encode(sentences)
    assert restored.vocab_size == joint.vocab_size


def train_tiny(
    texts: tuple[list[str], list[str]],
    cache_dir: Path,
    *,
    config: SubwordConfig = TINY,
    corpus_key: str = "m30k",
    src_lines: int = 500,
) -> tuple[Tokenizer, Tokenizer]:
    """Train (or load) on a short slice: fast enough to train several models per test."""
    src, tgt = texts
    return train_or_load(
        src_texts=src[:src_lines],
        tgt_texts=tgt[:500],
        config=config,
        cache_dir=cache_dir,
        corpus_key=corpus_key,
    )


def test_cache_hit_does_not_retrain(
    texts: tuple[list[str], list[str]], tmp_path: Path, count_trainings: list[int]
) -> None:
    first, second = train_tiny(texts, tmp_path)
    assert first is second  # joint: one model for both sides
    assert len(count_trainings) == 1
    (model_file,) = tmp_path.glob("*.model")
    mtime = model_file.stat().st_mtime_ns
    again, _ = train_tiny(texts, tmp_path)
    assert len(count_trainings) == 1
    assert model_file.stat().st_mtime_ns == mtime
    assert again.to_bytes() == first.to_bytes()
    # no temp files left behind; the model's checksum beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == [model_file.name, f"{model_file.name}.sha256"]


@pytest.mark.parametrize(
    "change",
    [
        {"config": SubwordConfig(vocab_size=150)},
        {"config": SubwordConfig(vocab_size=200, character_coverage=0.9995)},
        {"corpus_key": "other"},
        {"src_lines": 400},
    ],
    ids=["vocab_size", "character_coverage", "corpus_key", "texts"],
)
def test_changed_setting_retrains(
    texts: tuple[list[str], list[str]], tmp_path: Path, count_trainings: list[int], change: dict
) -> None:
    train_tiny(texts, tmp_path)
    train_tiny(texts, tmp_path, **change)
    assert len(count_trainings) == 2
    assert len(list(tmp_path.glob("*.model"))) == 2
    train_tiny(texts, tmp_path, **change)  # and the changed model is cached too
    assert len(count_trainings) == 2


def test_separate_models(texts: tuple[list[str], list[str]], tmp_path: Path) -> None:
    src, tgt = texts
    config = SubwordConfig(vocab_size=300, joint=False)
    src_tok, tgt_tok = train_or_load(
        src_texts=src, tgt_texts=tgt, config=config, cache_dir=tmp_path, corpus_key="k"
    )
    assert src_tok is not tgt_tok
    assert src_tok.to_bytes() != tgt_tok.to_bytes()
    assert len(list(tmp_path.glob("*.model"))) == 2
    assert src_tok.decode(src_tok.encode(src[:20])) == [" ".join(t.split()) for t in src[:20]]
    assert tgt_tok.decode(tgt_tok.encode(tgt[:20])) == [" ".join(t.split()) for t in tgt[:20]]
    # German-only pieces exist in the source model but not the target one.
    assert "▁Mann" in src_tok.id_to_piece(list(range(src_tok.vocab_size)))
    assert "▁Mann" not in tgt_tok.id_to_piece(list(range(tgt_tok.vocab_size)))


def test_bpe(texts: tuple[list[str], list[str]], tmp_path: Path) -> None:
    src, tgt = texts
    config = SubwordConfig(model_type="bpe", vocab_size=500)
    tok, _ = train_or_load(src_texts=src, tgt_texts=tgt, config=config, cache_dir=tmp_path, corpus_key="k")
    assert tok.vocab_size == 500
    assert tok.decode(tok.encode(tgt[:50])) == [" ".join(t.split()) for t in tgt[:50]]
    assert tok.id_to_piece([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == ["<pad>", "<unk>", "<s>", "</s>"]


def test_too_large_bpe_vocab_is_a_clear_error(tmp_path: Path) -> None:
    config = SubwordConfig(model_type="bpe", vocab_size=5000)
    with pytest.raises(TokenizerError, match="bpe model with vocab_size=5000"):
        train_or_load(
            src_texts=["a b c"], tgt_texts=["d e f"], config=config, cache_dir=tmp_path, corpus_key="k"
        )
    assert not list(tmp_path.iterdir())


def test_an_unknown_subword_key_names_the_section_and_the_valid_keys() -> None:
    with pytest.raises(
        TokenizerError, match=r"unknown key\(s\) \['vocab'\] in data.subword; valid keys: \['model_type'"
    ):
        settings_from_config(SubwordConfig, {"vocab": 8000}, "data.subword")
    assert settings_from_config(SubwordConfig, {"vocab_size": 60}, "data.subword") == SubwordConfig(
        vocab_size=60
    )


def test_invalid_config_messages() -> None:
    with pytest.raises(TokenizerError, match=r"\['unigram', 'bpe'\], got 'wordpiece'"):
        SubwordConfig(model_type="wordpiece")
    with pytest.raises(TokenizerError, match=r"vocab_size must be > 4 .*got 4"):
        SubwordConfig(vocab_size=4)
    with pytest.raises(TokenizerError, match=r"at most 262,144, got 300000"):
        SubwordConfig(vocab_size=300_000)


def test_from_bytes_refuses_garbage_and_oversized_models(
    spm_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read from a checkpoint, a sentencepiece model is bounded: bytes before parsing, pieces after."""
    with pytest.raises(TokenizerError, match="not a valid sentencepiece model"):
        Tokenizer.from_bytes(b"\x0a\xff not a model")
    with pytest.raises(TokenizerError, match=r"of 8,388,609 bytes; at most 8,388,608"):
        Tokenizer.from_bytes(bytes(8 * 2**20 + 1))
    monkeypatch.setattr(tokenizer_module, "MAX_PIECES", spm_tokenizer.vocab_size - 1)
    with pytest.raises(TokenizerError, match=rf"of {spm_tokenizer.vocab_size} pieces; at most"):
        Tokenizer.from_bytes(spm_tokenizer.to_bytes())
