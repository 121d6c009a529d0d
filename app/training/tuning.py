"""A tuning study that resumes: what an earlier ``train.py -m experiment=tune_*`` left in the study's storage.

Hydra's Optuna sweeper (hydra-optuna-sweeper) asks Optuna for ``n_trials`` new trials every time it runs,
numbers its jobs from 0 each time, and leaves a trial that was running when the sweep was killed in the
state RUNNING for good. Run again on the same SQLite study, it would train ``n_trials`` more, write them into
the first run's job directories, and count the killed trial as neither finished nor failed. The project's
sweeper (``hydra_plugins/attn_mt/resumable_optuna.py``) reads the study first with :func:`resume_study`:

- a trial left RUNNING is marked failed, with the user attribute ``interrupted``, and its values are queued
  again, so the next trial trains them anew (one sweeping process per study: a RUNNING trial is a dead one);
- ``n_trials`` counts the study's finished trials (completed, pruned or failed; interrupted ones excepted),
  so the same command run again trains only the trials still missing;
- job numbers continue from the study's trial count, so trial N trains in ``<sweep dir>/trial_N``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

log = logging.getLogger(__name__)

INTERRUPTED = "interrupted"  # user attribute of a trial whose sweep was killed while it trained
ENDED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
TRIAL_DIR = (
    "trial_{number}"  # a trial's job directory in the sweep dir (conf/sweep/tune.yaml: hydra.sweep.subdir)
)


@dataclass(frozen=True)
class StudyStart:
    """Where a sweep starts in its study."""

    finished: int  # trials that ended (completed, pruned or failed), interrupted ones not counted
    next_job: int  # the number of the next trial asked for, and so its job's number
    requeued: list[int]  # trials found RUNNING (interrupted), their values queued again


def resume_study(storage: str | None, study_name: str | None, sweep_dir: Path) -> StudyStart:
    """Read (and repair) the study an earlier sweep left in ``storage``; a new study starts at zero.

    ``sweep_dir`` is created first: the SQLite file of ``sqlite:///<sweep dir>/study.db`` lives in it.
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its schema set-up says a dozen lines at INFO
    if storage is None or study_name is None:  # in memory: nothing to resume
        return StudyStart(0, 0, [])
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # no study of that name yet
        return StudyStart(0, 0, [])
    requeued = [fail_interrupted(study, trial) for trial in study.get_trials(deepcopy=False)]
    requeued = [number for number in requeued if number is not None]
    trials = study.get_trials(deepcopy=False)
    finished = sum(1 for t in trials if t.state in ENDED and not t.user_attrs.get(INTERRUPTED))
    asked = sum(1 for t in trials if t.state != TrialState.WAITING)
    return StudyStart(finished, asked, requeued)


def fail_interrupted(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> int | None:
    """Mark a trial left RUNNING failed and interrupted, and queue its values again; its number, or None
    for a trial in any other state."""
    if trial.state != TrialState.RUNNING:
        return None
    storage = study._storage  # Optuna 2.10 has no public call that ends another process's trial
    storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
    storage.set_trial_state(trial._trial_id, TrialState.FAIL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.enqueue_trial(dict(trial.params))
    log.warning("trial %d was interrupted: marked failed, its values queued again", trial.number)
    return trial.number


def trials_to_run(wanted: int, start: StudyStart) -> int:
    """How many new trials bring the study to ``wanted`` finished ones."""
    return max(0, wanted - start.finished)


def no_trial_completed(storage: str | None, study_name: str | None) -> bool:
    """Whether the stored study has no completed trial (False for a study kept in memory: unknown)."""
    if storage is None or study_name is None:
        return False
    study = optuna.load_study(study_name=study_name, storage=storage)
    return not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))


def trial_dir(number: int) -> str:
    """The job directory of trial ``number``, relative to the sweep directory."""
    return TRIAL_DIR.format(number=number)
