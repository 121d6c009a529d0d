"""The summary of a tuning study (``sweep=tune``): its best trial, the parameters' importances, every trial.

Written when the sweep ends (:class:`TuningSummary`, a Hydra callback) into the sweep directory as
``tuning.md`` and ``tuning.json``, and printed. It reads the study from its storage, so a resumed study's
summary covers the trials of every run of the command, and a study already complete is summarised again.

The importances are Optuna's own (:func:`optuna.importance.get_param_importances`) with its mean-decrease-
in-impurity evaluator (a random forest fitted to the completed trials): the default fANOVA evaluator of
Optuna 2.10, the version hydra-optuna-sweeper 1.3 requires, fails under NumPy 2. With few trials they are
a rough guide: a forest of 8 points tells which lever moved the score most in this study, nothing finer.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import optuna
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from optuna.importance import MeanDecreaseImpurityImportanceEvaluator
from optuna.trial import FrozenTrial, TrialState

from app.io import atomic_write
from app.reports.render import Bullets, Heading, Paragraph, Table, markdown
from app.training.tuning import INTERRUPTED, trial_dir

SUMMARY_MD, SUMMARY_JSON = "tuning.md", "tuning.json"
IMPORTANCE = "Optuna's mean decrease in impurity (random forest, seed 0)"


class TuningSummary(Callback):
    """Hydra callback: at the end of a tuning sweep, write and print the study's summary."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweeper = config.hydra.sweeper
        study = optuna.load_study(study_name=sweeper.study_name, storage=sweeper.storage)
        objective = f"val/{config.selection.metric}"  # what best.ckpt follows (selection.metric)
        summary = study_summary(study, objective=objective, steps=config.trainer.max_steps)
        text = write_summary(Path(config.hydra.sweep.dir), summary)
        print(text, flush=True)


def study_summary(study: optuna.Study, *, objective: str, steps: int) -> dict[str, Any]:
    """The study as plain data: counts, best trial, importances (or why there are none), every trial."""
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    best = max(done, key=lambda t: t.value) if done else None
    importances, why_none = param_importances(study, len(done))
    return {
        "study": study.study_name,
        "objective": f"the best {objective} while training (maximised)",
        "steps_per_trial": steps,
        "states": {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState},
        "interrupted": [t.number for t in trials if t.user_attrs.get(INTERRUPTED)],
        "best": None if best is None else trial_record(best),
        "importances": importances,
        "importance_method": IMPORTANCE,
        "importances_missing": why_none,
        "trials": [trial_record(t) for t in trials if t.state != TrialState.WAITING],
    }


def param_importances(study: optuna.Study, completed: int) -> tuple[dict[str, float], str | None]:
    """Each parameter's share of the objective's variation across the completed trials (summing to 1),
    or an empty dict and the reason there is none."""
    if completed < 2:
        return {}, f"{completed} completed trial(s): importances need at least 2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        found = optuna.importance.get_param_importances(
            study, evaluator=MeanDecreaseImpurityImportanceEvaluator(seed=0)
        )
    if any(math.isnan(v) for v in found.values()):
        return {}, "the completed trials scored alike: no parameter explains a difference"
    return {name: round(value, 4) for name, value in found.items()}, None


def trial_record(trial: FrozenTrial) -> dict[str, Any]:
    """One trial: number, state, objective, parameters, seconds and its job directory."""
    seconds = None
    if trial.datetime_start and trial.datetime_complete:
        seconds = round((trial.datetime_complete - trial.datetime_start).total_seconds(), 1)
    return {
        "trial": trial.number,
        "state": trial.state.name.lower() + (" (interrupted)" if trial.user_attrs.get(INTERRUPTED) else ""),
        "value": trial.value,
        "params": dict(trial.params),
        "seconds": seconds,
        "dir": trial_dir(trial.number),
    }


def write_summary(sweep_dir: Path, summary: dict[str, Any]) -> str:
    """``tuning.json`` and ``tuning.md`` in ``sweep_dir`` (atomically); returns the Markdown."""
    text = markdown(summary_blocks(summary))
    with atomic_write(sweep_dir / SUMMARY_JSON, "w") as out:
        out.write(json.dumps(summary, indent=2) + "\n")
    with atomic_write(sweep_dir / SUMMARY_MD, "w", encoding="utf-8") as out:
        out.write(text)
    return text


def summary_blocks(summary: dict[str, Any]) -> list[Any]:
    """The summary as render blocks: the study in one line, the best trial, importances, the trials."""
    counts = ", ".join(f"{n} {state}" for state, n in summary["states"].items() if n)
    blocks: list[Any] = [
        Heading(f"Tuning study {summary['study']}"),
        Paragraph(
            f"Objective: {summary['objective']}; {summary['steps_per_trial']} steps per trial. "
            f"Trials: {counts or 'none'}."
        ),
        Heading("Best trial", 2),
    ]
    best = summary["best"]
    if best is None:
        blocks.append(Paragraph("No trial completed."))
    else:
        blocks.append(Paragraph(f"trial {best['trial']} ({best['dir']}): {best['value']:.2f}"))
        blocks.append(Bullets([f"{name}={format_value(v)}" for name, v in best["params"].items()]))
    blocks.append(Heading("Parameter importances", 2))
    if summary["importances"]:
        blocks.append(Paragraph(summary["importance_method"] + ":"))
        rows = [[name, f"{share:.3f}"] for name, share in summary["importances"].items()]
        blocks.append(Table(("parameter", "importance"), rows))
    else:
        blocks.append(Paragraph(f"None: {summary['importances_missing']}."))
    blocks += [Heading("Trials", 2), trials_table(summary["trials"])]
    return blocks


def trials_table(trials: list[dict[str, Any]]) -> Table:
    """One row per trial: number, state, objective, seconds, then one column per parameter."""
    names = sorted({name for t in trials for name in t["params"]})
    rows = [
        [
            str(t["trial"]),
            t["state"],
            "" if t["value"] is None else f"{t['value']:.2f}",
            "" if t["seconds"] is None else f"{t['seconds']:.0f}",
            *(format_value(t["params"].get(name, "")) for name in names),
        ]
        for t in trials
    ]
    return Table(("trial", "state", "value", "seconds", *names), rows)


def format_value(value: Any) -> str:
    """A parameter value, floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
