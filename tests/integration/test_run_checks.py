"""Checks that stop a run before it goes wrong: unset mandatory config values named by path, a resume
on other data refused naming what changed, and checkpoint averaging that holds one file at a time."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.training import compose_train, tiny_overrides, write_corpus_slice

from app import checkpoint as checkpoint_module
from app.checkpoint import average_checkpoints, read_checkpoint
from app.training.callbacks import DataFingerprint, fingerprint_changes
from app.training.task import train, train_or_exit

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_unset_mandatory_values_are_named_by_path_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    cfg = compose_train(["data=custom", "data.files.valid.src=v.de", f"output_dir={run}"])
    expected = ", ".join(
        f"data.files.{split}.{side}"
        for split, side in [
            ("test", "src"),
            ("test", "tgt"),
            ("train", "src"),
            ("train", "tgt"),
            ("valid", "tgt"),
        ]
    )
    with pytest.raises(SystemExit) as exit_:
        train_or_exit(cfg)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: mandatory config value(s) not set: {expected}; " + (
        "give each on the command line, e.g. data.files.test.src=...\n"
    )
    assert not run.exists()


def test_averaging_holds_one_checkpoint_besides_the_running_sum(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [tmp_path / f"step-{i}.ckpt" for i in range(4)]
    for seed, path in enumerate(paths):
        checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"}, seed=seed)
    loaded: list[weakref.ref[torch.Tensor]] = []
    alive_when_reading: list[int] = []

    def counting_read(path: Any) -> dict[str, Any]:
        gc.collect()
        alive_when_reading.append(sum(ref() is not None for ref in loaded))
        checkpoint = read_checkpoint(path)
        loaded.append(weakref.ref(next(iter(checkpoint["state_dict"].values()))))
        return checkpoint

    monkeypatch.setattr(checkpoint_module, "read_checkpoint", counting_read)
    averaged = average_checkpoints(paths)["state_dict"]
    assert alive_when_reading == [0, 0, 0, 0]  # every earlier file was freed before the next was read
    monkeypatch.undo()
    weights = [read_checkpoint(p)["state_dict"] for p in paths]
    for name, value in averaged.items():
        expected = sum(w[name].double() for w in weights) / len(weights)
        torch.testing.assert_close(value, expected.to(value.dtype), rtol=0, atol=1e-7)


def test_fingerprint_changes_name_what_changed() -> None:
    saved = {"train.src": "a" * 64, "train.tgt": "b" * 64, "src_tokenizer": "c" * 64}
    now = {"train.src": "a" * 64, "train.tgt": "b" * 64, "src_tokenizer": "d" * 64}
    assert fingerprint_changes(saved, saved) == []
    assert fingerprint_changes(saved, now) == [
        "the source sentencepiece model changed (sha256 cccccccccccc in the checkpoint, dddddddddddd now)"
    ]
    callback = DataFingerprint()
    callback.load_state_dict(saved)  # not fitting (validate or test from a checkpoint): nothing to check
    callback.fingerprint = now
    with pytest.raises(
        ValueError, match=r"cannot resume: the checkpoint was trained on other data \(the source"
    ):
        callback.load_state_dict(saved)


def test_resume_refuses_a_changed_corpus(multi30k_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 60, "val": 10, "test_2016_flickr": 5}
    )
    run = tmp_path / "run"

    def overrides(*extra: str) -> list[str]:
        return tiny_overrides(corpus, run, tmp_path / "cache", "checkpoint.every_n_steps=2", *extra)

    train(compose_train(overrides("trainer.max_steps=2")))
    # all of it plain data: torch's own weights-only loader, with nothing allow-listed, opens it
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["translation"]["format_version"] == 1
    saved = last["callbacks"]["DataFingerprint"]
    assert set(saved) == {
        "train.src",
        "train.tgt",
        "valid.src",
        "valid.tgt",
        "src_tokenizer",
        "tgt_tokenizer",
    }
    lines = (corpus / "train.de").read_text().splitlines(keepends=True)
    (corpus / "train.de").write_text("".join([lines[1], lines[0], *lines[2:]]))  # same size and vocabulary
    with pytest.raises(ValueError, match=r"cannot resume: .*the training source texts changed"):
        train(compose_train(overrides("trainer.max_steps=4", "resume=true")))


def test_limits_that_leave_no_training_data_stop_before_a_trainer_with_one_error_line(
    multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's ``experiment=quickstart data.concat=16`` on the fixture corpus: every joined example is
    longer than data.max_len=128. It used to train nothing, then end in a traceback about a missing
    checkpoint; now train.py's entry ends before any Trainer exists, with one error: line, status 2."""
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 60, "val": 10, "test_2016_flickr": 5}
    )
    run = tmp_path / "run"
    overrides = tiny_overrides(corpus, run, tmp_path / "cache", "data.concat=16", "model.max_positions=256")
    with pytest.raises(SystemExit) as stopped:
        train_or_exit(compose_train(overrides))
    assert stopped.value.code == 2
    err = capsys.readouterr().err  # progress bars, then the one line
    assert "Traceback" not in err and err.endswith("\n") and err.count("error:") == 1
    line = err.splitlines()[-1]
    assert line.startswith("error: the length filter keeps 0 of 4 training examples")
    assert "are longer than 128 subwords (data.max_len=128)" in line
    assert "data.concat=16 joins 16 sentence pairs an example; experiment=ablation_length" in line
    assert not (run / "checkpoints").exists()  # stopped before the Trainer was built


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optim.schedule=cosine_typo"], "error: optim.schedule='cosine_typo'; valid choices: "),
        (["selection.metric=rouge"], "error: selection.metric='rouge'; valid choices: "),
        (["+trainer.max_stepz=3"], "error: unknown trainer option(s) ['max_stepz']; valid options: "),
        (
            ["attention=sparse", "attention.pattern=diagonal"],
            "error: unknown sparse attention pattern 'diagonal'",
        ),
        (["data.max_tokens=-5"], "error: data.max_tokens=-5: a batch's budget of padded tokens, a positive"),
        (["data.eval_max_tokens=true"], "error: data.eval_max_tokens=True: a batch's budget of padded"),
        (['data.tag_format="<2>"'], "error: data.tag_format must hold {lang} once and no spaces"),
    ],
    ids=["schedule", "selection", "trainer", "attention", "batch", "eval-batch", "tag-format"],
)
def test_a_config_that_cannot_work_is_one_error_line(
    overrides: list[str], message: str, multi30k_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 40, "val": 5, "test_2016_flickr": 5}
    )
    cfg = compose_train(tiny_overrides(corpus, tmp_path / "run", tmp_path / "cache", *overrides))
    with pytest.raises(SystemExit) as exit_:
        train_or_exit(cfg)
    assert exit_.value.code == 2
    err = capsys.readouterr().err  # progress bars, then the one line
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert err.splitlines()[-1].startswith(message), err
