"""Length limits that leave a split (nearly) empty are refused before training, naming the filter, what
it dropped and the settings that would keep the examples (app/data/length_check.py)."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
from helpers.configs import CONF_DIR
from omegaconf import OmegaConf

from app.data.corpora import Corpora
from app.data.datamodule import TranslationDataModule
from app.data.length_check import (
    LONG_INPUT_CONCAT,
    LONG_INPUT_EXPERIMENT,
    LengthError,
    LengthLimits,
    check_evaluation_lengths,
    check_training_lengths,
)
from app.data.tokenizer import Tokenizer


def lengths(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_a_training_split_that_max_len_empties_names_the_filter_the_count_and_the_settings() -> None:
    src, tgt = lengths(240, 250, 300, 0), lengths(230, 641, 260, 5)  # the last pair has no source text
    with pytest.raises(LengthError) as refused:
        check_training_lengths(src, tgt, kept=0, limits=LengthLimits(128, 256, concat=16))
    message = str(refused.value)
    assert message.startswith("the length filter keeps 0 of 3 training examples, less than data.min_kept=0.5")
    assert "3 are longer than 128 subwords (data.max_len=128)" in message
    assert "set data.max_len>=641 and model.max_positions>=642" in message
    assert f"data.concat=16 joins 16 sentence pairs an example; experiment={LONG_INPUT_EXPERIMENT}" in message


def test_the_limit_model_max_positions_sets_and_the_ratio_filter_are_named() -> None:
    src, tgt = lengths(10, 80, 90, 10), lengths(10, 70, 90, 60)
    with pytest.raises(LengthError) as refused:
        check_training_lengths(src, tgt, kept=1, limits=LengthLimits(128, 64))
    message = str(refused.value)
    assert "keeps 1 of 4 training examples" in message
    assert "2 are longer than 63 subwords (model.max_positions=64 leaves room for 63)" in message
    assert "and data.max_ratio drops 1 more" in message
    assert "data.concat" not in message  # one pair an example: no experiment to name


def test_a_split_that_keeps_enough_passes_and_min_kept_0_stops_only_an_empty_one() -> None:
    src = tgt = lengths(10, 20, 200, 300)
    check_training_lengths(src, tgt, kept=2, limits=LengthLimits(128, 256))  # half kept: enough
    with pytest.raises(LengthError, match="keeps 1 of 4"):
        check_training_lengths(src, tgt, kept=1, limits=LengthLimits(128, 256))
    check_training_lengths(src, tgt, kept=1, limits=LengthLimits(128, 256, min_kept=0.0))
    with pytest.raises(LengthError, match="keeps 0 of 4"):
        check_training_lengths(src, tgt, kept=0, limits=LengthLimits(128, 256, min_kept=0.0))
    with pytest.raises(LengthError, match="no pairs with text on both sides"):
        check_training_lengths(lengths(0, 3), lengths(4, 0), kept=0, limits=LengthLimits(128, 256))
    with pytest.raises(ValueError, match=r"data.min_kept must be in \[0, 1\]"):
        LengthLimits(128, 256, min_kept=1.5)


def test_an_evaluation_split_mostly_longer_than_the_model_reads_or_empty_is_refused() -> None:
    limits = LengthLimits(128, 256, concat=16)
    check_evaluation_lengths("valid", lengths(100, 300), lengths(90, 280), limits)  # half fits
    with pytest.raises(LengthError) as refused:
        check_evaluation_lengths("test", lengths(100, 300, 400), lengths(90, 280, 420), limits)
    message = str(refused.value)
    assert message.startswith("1 of 3 test examples fit the model whole, less than data.min_kept=0.5")
    assert "2 are longer than 255 subwords (model.max_positions=256 leaves room for 255)" in message
    assert "set model.max_positions>=421" in message and f"experiment={LONG_INPUT_EXPERIMENT}" in message
    with pytest.raises(
        LengthError, match=r"the valid split has no examples: check its files \(data.files.valid\)"
    ):
        check_evaluation_lengths("valid", lengths(), lengths(), limits)


def test_the_named_experiment_keeps_the_longest_joined_examples() -> None:
    experiment = OmegaConf.load(CONF_DIR / "experiment" / f"{LONG_INPUT_EXPERIMENT}.yaml")
    # K=64 Multi30k examples reach ~1,300 subwords a side (the experiment's own comment)
    assert experiment.data.max_len >= 1300 and experiment.model.max_positions > experiment.data.max_len
    assert LONG_INPUT_CONCAT == 64


def test_the_datamodule_refuses_a_validation_split_the_model_cannot_read_whole(
    spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """Wired in setup: short training pairs pass, a validation set of long ones is refused by name."""
    short = datasets.Dataset.from_dict({"src": ["Ein Hund."] * 8, "tgt": ["A dog."] * 8})
    long = datasets.Dataset.from_dict({"src": ["Ein Hund läuft im Park. " * 20] * 4, "tgt": ["A dog."] * 4})
    module = TranslationDataModule(
        corpora=Corpora.of_texts({"train": short, "valid": long}),
        src_tokenizer=spm_tokenizer,
        tgt_tokenizer=spm_tokenizer,
        max_tokens=500,
        max_len=100,
        max_positions=64,
        cache_dir=tmp_path / "tokens",
    )
    with pytest.raises(LengthError, match="0 of 4 valid examples fit the model whole"):
        module.setup()
