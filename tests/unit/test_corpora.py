"""The run's corpora built once (:mod:`app.data.corpora`), and the schedule handed to its one adjuster."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from pytorch_lightning.callbacks import Timer

from app.data.concat import SEPARATOR
from app.data.corpora import Corpora, CorpusLayout
from app.data.corpus import CorpusError
from app.data.tokenizer import Tokenizer
from app.training.callbacks import DecayToTimeBudget
from app.training.module import TranslationModule
from app.training.optim import AUTO, NO_TIME_BUDGET, configured_schedule

SPLITS = {"train": 7, "valid": 5, "test": 3}  # lines per split


def write_pairs(root: Path, direction: str) -> dict[str, dict[str, str]]:
    """Line-aligned files of one direction, ``{split: {"src": path, "tgt": path}}``."""
    files = {}
    for split, lines in SPLITS.items():
        files[split] = {}
        for side in ("src", "tgt"):
            path = root / f"{direction}.{split}.{side}"
            path.write_text("".join(f"{direction} {split} {side} {i}\n" for i in range(lines)))
            files[split][side] = str(path)
    return files


def test_an_untagged_run_is_one_direction_spanning_every_split(tmp_path: Path) -> None:
    data = {"src_lang": "de", "tgt_lang": "en", "files": write_pairs(tmp_path, "de-en"), "directions": None}
    corpora = Corpora.load({**data, "cache_dir": str(tmp_path / "cache")})
    layout = corpora.layout
    assert (layout.directions, layout.tagged, layout.separator) == (("de-en",), False, None)
    assert layout.scored_directions == () and layout.scoring_lang == "en" and layout.langs == ("de", "en")
    for split, lines in SPLITS.items():
        assert corpora[split].spans == (("de-en", 0, lines),) and corpora[split].scored_directions == ()
    assert corpora["valid"].references == [f"de-en valid tgt {i}" for i in range(5)]
    codes, names = corpora["train"].direction_codes()
    assert codes.tolist() == [0] * 7 and names == ["de-en"]


def test_joined_examples_are_spanned_and_scored_after_joining(tmp_path: Path) -> None:
    data = {"src_lang": "de", "tgt_lang": "en", "files": write_pairs(tmp_path, "de-en"), "concat": 2}
    corpora = Corpora.load({**data, "cache_dir": str(tmp_path / "cache")})
    assert corpora.layout.separator == SEPARATOR and corpora.layout.symbols == [SEPARATOR]
    assert corpora["train"].spans == (("de-en", 0, 4),)  # 7 sentences, 2 an example
    assert corpora["valid"].references[0] == f"de-en valid tgt 0 {SEPARATOR} de-en valid tgt 1"
    assert corpora.train_sentences.num_rows == 7  # what the tokenizers learn from


def test_tagged_directions_follow_one_another_with_their_spans(tmp_path: Path) -> None:
    pairs = {d: write_pairs(tmp_path, d) for d in ("de-en", "en-fr")}
    corpora = Corpora.load({"pairs": pairs, "directions": None, "cache_dir": str(tmp_path / "cache")})
    assert corpora.layout.scored_directions == ("de-en", "en-fr") and corpora.layout.scoring_lang is None
    assert corpora["test"].spans == (("de-en", 0, 3), ("en-fr", 3, 6))
    assert corpora["test"].sources[3] == "<2fr> en-fr test src 0"
    assert corpora.layout.symbols == ["<2en>", "<2fr>"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"directions": ["de-en"], "concat": 2}, "cannot be combined"),
        ({"directions": ["de-en"], "hub": {"name": "x"}}, "not data.hub"),
        ({"src_lang": "de", "tgt_lang": "en", "concat": 0}, "data.concat must be >= 1"),
    ],
)
def test_a_layout_the_loaders_cannot_build_is_refused(data: dict, message: str) -> None:
    with pytest.raises((CorpusError, ValueError), match=message):
        CorpusLayout.from_config(data)


def test_of_texts_makes_one_untagged_direction_of_in_memory_splits() -> None:
    texts = datasets.Dataset.from_dict({"src": ["a", "b"], "tgt": ["x", "y"]})
    corpora = Corpora.of_texts({"train": texts, "valid": texts})
    assert corpora["valid"].spans == (("de-en", 0, 2),) and corpora.texts()["train"] is texts


def test_validation_is_scored_against_the_split_the_module_was_given(
    spm_tokenizer: Tokenizer,
    make_transformer: Callable[..., torch.nn.Module],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    valid = datasets.Dataset.from_dict({"src": ["a", "b"], "tgt": ["A dog runs.", "A cat sleeps."]})
    model = make_transformer(
        src_vocab_size=spm_tokenizer.vocab_size,
        tgt_vocab_size=spm_tokenizer.vocab_size,
        pad_id=spm_tokenizer.pad_id,
    )
    module = TranslationModule(
        model=model,
        src_tokenizer=spm_tokenizer,
        tgt_tokenizer=spm_tokenizer,
        config={},
        validation=Corpora.of_texts({"train": valid, "valid": valid})["valid"],
    )
    logged: dict[str, float] = {}
    monkeypatch.setattr(module, "log", lambda name, value, **kwargs: logged.__setitem__(name, value))
    monkeypatch.setattr(TranslationModule, "trainer", SimpleNamespace(world_size=1))  # no datamodule
    module._valid_hyps = {0: spm_tokenizer.encode(["A dog runs."])[0]}  # only the first row decoded
    module.on_validation_epoch_end()
    assert logged["val/bleu"] == pytest.approx(100.0) and not any("/de-en" in key for key in logged)


def test_decay_steps_auto_needs_a_time_budget_and_its_callback_moves_the_modules_schedule(
    spm_tokenizer: Tokenizer, make_transformer: Callable[..., torch.nn.Module]
) -> None:
    optim = {"schedule": "cosine", "warmup_steps": 3, "decay_steps": AUTO}
    with pytest.raises(ValueError, match=r"trainer\.max_time is not set"):
        configured_schedule(optim, max_time=None)
    assert NO_TIME_BUDGET.startswith("optim.decay_steps=auto")
    schedule = configured_schedule(optim, max_time="00:00:01:00")
    model = make_transformer(
        src_vocab_size=spm_tokenizer.vocab_size,
        tgt_vocab_size=spm_tokenizer.vocab_size,
        pad_id=spm_tokenizer.pad_id,
    )
    module = TranslationModule(
        model=model, src_tokenizer=spm_tokenizer, tgt_tokenizer=spm_tokenizer, config={}, schedule=schedule
    )
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    timer = Timer(duration="00:00:01:00")
    timer.time_remaining = lambda: 10.0  # ten seconds of the budget left
    trainer = SimpleNamespace(
        global_step=10, max_steps=-1, callbacks=[timer], strategy=SimpleNamespace(broadcast=lambda x: x)
    )
    callback = DecayToTimeBudget(schedule)
    callback._started = (0, time.monotonic() - 10.0)  # ten steps in ten seconds: one a second
    callback.update(trainer, SimpleNamespace(log=lambda *args, **kwargs: None))
    assert [fn.decay_steps for fn in scheduler.lr_lambdas] == [pytest.approx(20, abs=1)] * 2
