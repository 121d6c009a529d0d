"""Choose what decodes the test set using the validation set alone: a checkpoint and its search settings.

After training, several candidates may be worth scoring: the best checkpoint by validation BLEU, the
average of the last few step checkpoints, and a small grid of beam sizes and length penalties. Each
pair (checkpoint, settings) is one :class:`Trial` on the validation set; the trial with the highest
validation BLEU decodes the test set. The test references never take part in the choice.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from app.data.corpora import CorpusLayout, Split
from app.errors import ConfigError
from app.inference.directions import direction_scores, mean_scores
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.evaluate import evaluate

SELECTION_METRICS = ("bleu", "bleu_lc")  # what validation can maximise: cased or lowercased BLEU
SELECTION_OPTIONS = ("alpha", "average_last", "beam", "direction", "metric")  # the ``selection`` keys


@dataclass(frozen=True)
class Trial:
    """One candidate decoding of the validation set and its scores."""

    checkpoint: str
    beam: int
    alpha: float
    bleu: float  # cased validation BLEU (val/bleu)
    bleu_lc: float  # lowercased (val/bleu_lc)

    def as_dict(self) -> dict[str, str | int | float]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def search_grid(
    base: SearchSettings, beams: Sequence[int] | None = None, alphas: Sequence[float] | None = None
) -> list[SearchSettings]:
    """``base`` with every combination of ``beams`` x ``alphas`` (None: the base's own value)."""
    beams = list(beams) if beams else [base.beam]
    alphas = list(alphas) if alphas else [base.alpha]
    return [replace(base, beam=beam, alpha=alpha) for beam, alpha in itertools.product(beams, alphas)]


def validation_trials(
    checkpoints: Sequence[str | os.PathLike[str]],
    grid: Sequence[SearchSettings],
    valid: Split,
    *,
    device: str | torch.device = "cpu",
    direction: str | None = None,
) -> list[Trial]:
    """Every checkpoint decodes the validation split with every setting of ``grid`` (checkpoints outer).

    A trial's scores are the mean over the split's directions (an untagged split has one: its own
    scores, as ``val/bleu`` logs them), or with ``direction`` (``selection.direction``) that one's.
    """
    if not checkpoints or not grid:
        raise ValueError("validation_trials needs at least one checkpoint and one search setting")
    trials = []
    for checkpoint in checkpoints:
        engine = open_engine(checkpoint, engine="torch", device=str(device), sources_tagged=True)  # once
        for settings in grid:
            hypotheses = evaluate(engine, valid.sources, None, settings).hypotheses
            scores = direction_scores(hypotheses, valid.references, valid.spans, moses=False)
            chosen = asdict(scores[direction]) if direction is not None else mean_scores(scores)
            trials.append(
                Trial(str(checkpoint), settings.beam, settings.alpha, chosen["bleu"], chosen["bleu_lc"])
            )
    return trials


def best_trial(trials: Sequence[Trial], metric: str = "bleu") -> Trial:
    """The trial with the highest validation ``metric`` (``bleu`` or ``bleu_lc``); on a tie the earliest
    (the best checkpoint and the first settings come first, so a tie keeps the simpler choice)."""
    if not trials:
        raise ValueError("best_trial needs at least one trial")
    if metric not in SELECTION_METRICS:
        raise ValueError(f"unknown selection metric {metric!r}; valid: {', '.join(SELECTION_METRICS)}")
    return max(trials, key=lambda trial: getattr(trial, metric))  # max keeps the first of equal keys


def validation_metric(config: Mapping[str, Any]) -> str:
    """What validation maximises (``selection.metric``): best.ckpt, early stopping and the decoding grid."""
    return (config.get("selection") or {}).get("metric") or "bleu"


def validation_monitor(config: Mapping[str, Any]) -> str:
    """The logged value best.ckpt and early stopping follow: ``val/bleu`` (a multilingual run's mean over
    directions), or with ``selection.direction=de-en`` that direction's, ``val/bleu/de-en``."""
    direction = (config.get("selection") or {}).get("direction")
    return f"val/{validation_metric(config)}" + (f"/{direction}" if direction else "")


def check_selection(config: Mapping[str, Any]) -> None:
    """Refuse, before training (or rescoring), a ``selection`` that could not be carried out after it."""
    choice = config.get("selection") or {}
    unknown = sorted(set(choice) - set(SELECTION_OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown selection option(s) {unknown}; valid options: {', '.join(SELECTION_OPTIONS)}"
        )
    if validation_metric(config) not in SELECTION_METRICS:
        raise ConfigError(
            f"selection.metric={choice.get('metric')!r}; valid choices: {', '.join(SELECTION_METRICS)}"
        )
    direction = choice.get("direction")
    if direction is not None:
        directions = CorpusLayout.from_config(config.get("data") or {}).scored_directions
        if direction not in directions:
            raise ConfigError(
                f"selection.direction={direction!r} is not one of data.directions "
                f"({', '.join(directions) or 'none: a bilingual run has one direction'})"
            )
    for key in ("beam", "alpha"):
        values = choice.get(key)
        if values is not None and (isinstance(values, (str, int, float)) or not len(values)):
            raise ConfigError(f"selection.{key} must be a non-empty list (e.g. [4, 5]) or null: {values!r}")
    checkpoint = config.get("checkpoint") or {}
    last, keep = choice.get("average_last") or 0, checkpoint.get("keep_last") or 0
    if last and (last > keep or not checkpoint.get("every_n_steps")):
        raise ConfigError(
            f"selection.average_last={last} averages step checkpoints, but checkpoint.keep_last={keep} "
            f"and checkpoint.every_n_steps={checkpoint.get('every_n_steps')}: set keep_last >= {last} "
            "and every_n_steps"
        )
