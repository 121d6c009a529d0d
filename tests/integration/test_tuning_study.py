"""Tuning with Optuna through Hydra's sweeper, for real: ``train.py -m experiment=tune_quickstart_fp32`` on
a tiny model and corpus keeps its study in SQLite in the sweep directory; the same command run again
continues the study (its trial count grows, its first trial's directory stays), a failed trial is recorded
failed while the study goes on, and the summary names the best trial. The study's bookkeeping
(interrupted trials, what a job returns) is tested in-process below it."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from helpers.training import run_train, tiny_overrides, write_corpus_slice

from app.rundir import RunDir
from app.training.sweep import JobFailed, job_objective
from app.training.tuning import INTERRUPTED, StudyStart, resume_study, trials_to_run

SLICE = {"train": 200, "val": 20, "test_2016_flickr": 5}
TUNED = ("optim.lr=", "optim.warmup_steps=", "data.max_tokens=")  # searched by the experiment or set below


def load(sweep: Path) -> optuna.Study:
    return optuna.load_study(study_name="tune_quickstart_fp32", storage=f"sqlite:///{sweep}/study.db")


@pytest.mark.slow
def test_a_study_resumes_counts_a_failed_trial_and_names_its_best(multi30k_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus_slice(multi30k_dir, tmp_path / "corpus", SLICE)
    sweep = tmp_path / "study"
    tiny = [
        o
        for o in tiny_overrides(corpus, tmp_path / "unused", tmp_path / "cache")
        if not o.startswith(("output_dir=", "hydra.run.dir=", *TUNED))  # a sweep's jobs get their own dirs
    ]
    budget = ["trainer.max_steps=2", "trainer.val_check_interval=2", "optim.warmup_steps=1"]  # warm-up: fixed
    command = ["-m", "experiment=tune_quickstart_fp32", *tiny, *budget, "valid_search.max_len=8"]
    command.append(f"hydra.sweep.dir={sweep}")

    first = run_train([*command, "hydra.sweeper.n_trials=1"], timeout=300)
    assert [t.state for t in load(sweep).trials] == [optuna.trial.TrialState.COMPLETE]
    value = load(sweep).trials[0].value
    assert value == json.loads(RunDir(sweep / "trial_0").results.read_text())["val_best"]
    assert not RunDir(sweep / "trial_0").hypotheses.exists()  # tuned on validation: no test set decoded
    assert "Tuning study tune_quickstart_fp32" in first.stdout

    # run again for 2 trials in all: one more trial, in trial_1; it fails when built (3 KV heads for 4 heads)
    second = run_train(
        [*command, "hydra.sweeper.n_trials=2", "heads.num_kv_heads=3"], timeout=300, check=False
    )
    assert second.returncode == 1, second.stderr[-4000:]  # the study ended, then said that a job failed
    assert second.stderr.strip().splitlines()[-1].endswith(f"in {sweep}: trial_1")
    assert "1 of 2 trials finished, 1 to run, the next one trial_1" in second.stdout + second.stderr
    trials = load(sweep).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL"] and trials[0].value == value
    assert "num_kv_heads" in RunDir(sweep / "trial_1").failed.read_text()

    summary = json.loads((sweep / "tuning.json").read_text())
    assert summary["best"]["trial"] == 0 and summary["best"]["dir"] == "trial_0"
    assert summary["states"]["complete"] == 1 and summary["states"]["fail"] == 1
    markdown = (sweep / "tuning.md").read_text()
    assert f"trial 0 (trial_0): {value:.2f}" in markdown and markdown in second.stdout


def test_an_interrupted_trial_is_failed_and_tried_again(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    done = study.ask()
    done.suggest_float("x", 0.0, 1.0)
    study.tell(done, 1.0)
    killed = study.ask()  # a sweep killed while this trial trained: RUNNING for good
    x = killed.suggest_float("x", 0.0, 1.0)

    start = resume_study(storage, "s", tmp_path)
    assert start == StudyStart(finished=1, next_job=2, requeued=[1])
    assert trials_to_run(3, start) == 2 and trials_to_run(1, start) == 0
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert trials[1].state == optuna.trial.TrialState.FAIL and trials[1].user_attrs[INTERRUPTED]
    again = study.ask()  # the next trial asked trains the interrupted one's values
    assert again.number == 2 and again.suggest_float("x", 0.0, 1.0) == x
    assert resume_study(None, None, tmp_path) == StudyStart(0, 0, [])  # in memory: nothing to resume


def test_a_job_returns_its_best_validation_score_or_fails(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    with pytest.raises(JobFailed, match="exit code 1"):
        job_objective(tmp_path, 1)
    run.results.write_text(json.dumps({"val_best": None}))
    with pytest.raises(JobFailed, match="validated never"):
        job_objective(tmp_path, 0)
    run.results.write_text(json.dumps({"val_best": 12.5}))
    assert job_objective(tmp_path, 0) == 12.5
