"""The step after training: choose on validation, decode and score the test set, write the run's results.

One entry, :func:`score_run`, serves ``train(cfg)`` (right after ``trainer.fit``) and
:func:`rescore_run` (``scripts/rescore.py``: the same choice made again on a finished run, from its
checkpoints, without Lightning). Both read and write the run directory through
:class:`app.rundir.RunDir`. Configs arrive as plain mappings (the run's resolved config).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from app.checkpoint import (
    CHECKPOINT_KEY,
    average_checkpoints,
    read_checkpoint,
    save_atomically,
    step_checkpoints,
)
from app.data.corpora import Corpora
from app.inference.directions import direction_results
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.evaluate import Evaluation, evaluate
from app.inference.selection import (
    best_trial,
    check_selection,
    search_grid,
    validation_metric,
    validation_trials,
)
from app.io import atomic_write
from app.rundir import AVERAGED, RunDir

log = logging.getLogger(__name__)


def score_run(
    run: RunDir,
    config: Mapping[str, Any],
    corpora: Corpora,
    best_checkpoint: Path,
    *,
    device: str | torch.device = "cpu",
    kept: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Choose on validation, score the test set, and write ``test.hyp`` and ``results.json`` into ``run``.

    ``kept`` are the keys results.json carries besides the test scores (the run's statistics). Where
    the test split has directions scored on their own (a tagged run), each one's scores are added and
    ``test_bleu`` (etc.) become their mean. Returns what was written.
    """
    evaluation, selection = choose_and_score(config, corpora, best_checkpoint, device=device)
    results = {**evaluation.results(prefix="test_"), **(kept or {}), **selection}
    test = corpora["test"]
    if test.scored_directions:
        results.update(direction_results(evaluation.hypotheses, test.references, test.spans, prefix="test_"))
    write_test_results(run, evaluation, results)
    return results


def choose_and_score(
    config: Mapping[str, Any],
    corpora: Corpora,
    best_checkpoint: Path,
    *,
    device: str | torch.device = "cpu",
) -> tuple[Evaluation, dict[str, Any]]:
    """Decode and score the test set with what the validation set chose (``selection`` in the config).

    The candidates are ``best_checkpoint`` and, with ``selection.average_last=N``, the average of the
    run's newest N step checkpoints (written beside it as ``averaged.ckpt``); each decodes the validation
    set with every combination of ``selection.beam`` x ``selection.alpha`` (``test_search`` for the rest).
    The best validation ``selection.metric`` (cased or lowercased BLEU) wins. Returns the test evaluation
    and, when there was a choice, ``{"selection": {...}}`` with every trial for results.json.
    """
    settings = SearchSettings(**config["test_search"])
    choice = config.get("selection") or {}
    grid = search_grid(settings, choice.get("beam"), choice.get("alpha"))
    averaged = averaged_candidate(best_checkpoint.parent, choice.get("average_last"))
    candidates = [str(best_checkpoint), *averaged]
    chosen_checkpoint, selection = candidates[0], {}
    if len(candidates) * len(grid) > 1:
        trials = validation_trials(
            candidates, grid, corpora["valid"], device=device, direction=choice.get("direction")
        )
        metric = validation_metric(config)
        chosen = best_trial(trials, metric)
        chosen_checkpoint = chosen.checkpoint
        settings = replace(settings, beam=chosen.beam, alpha=chosen.alpha)
        trials_made = [t.as_dict() for t in trials]
        selection = {"selection": {"metric": metric, "chosen": chosen.as_dict(), "trials": trials_made}}
        log.info("chosen on validation: %s", json.dumps(selection["selection"]["chosen"]))
    test, layout = corpora["test"], corpora.layout
    evaluation = evaluate(
        open_engine(chosen_checkpoint, engine="torch", device=str(device), sources_tagged=True),
        test.sources,
        test.references,
        settings,
        test_set=config["data"].get("test_name", "test"),
        moses_lang=layout.scoring_lang,  # None for a tagged run: score_run scores each direction
        separator=layout.separator,
    )
    return evaluation, selection


def averaged_candidate(directory: Path, last: int | None) -> list[str]:
    """``[path]`` of the average of the newest ``last`` step checkpoints in ``directory``, written there
    as averaged.ckpt; ``[]`` when not asked for or fewer than two step checkpoints exist (a short run)."""
    if not last:
        return []
    paths = step_checkpoints(directory)[-last:]
    if len(paths) < 2:
        log.warning("selection.average_last=%d: %d step checkpoint(s), not averaging", last, len(paths))
        return []
    if len(paths) < last:
        log.warning("selection.average_last=%d: only %d step checkpoints to average", last, len(paths))
    averaged = directory / AVERAGED
    save_atomically(average_checkpoints(paths), averaged)
    log.info("averaged %s into %s", ", ".join(p.name for p in paths), averaged)
    return [str(averaged)]


def write_test_results(run: RunDir, evaluation: Evaluation, results: Mapping[str, Any]) -> None:
    """``test.hyp`` (one translation per line: reports compare variants sentence by sentence without
    re-decoding) and ``results.json``, each written atomically."""
    with atomic_write(run.hypotheses, "w", encoding="utf-8") as out:
        out.writelines(h.replace("\n", " ") + "\n" for h in evaluation.hypotheses)
    with atomic_write(run.results, "w") as out:
        out.write(json.dumps(results, indent=2) + "\n")


def rescore_run(run_dir: str | os.PathLike[str], overrides: list[str] | None = None) -> dict[str, Any]:
    """Choose on validation and score on test a finished run again, with the config its checkpoint holds plus
    ``overrides`` (``key=value``, e.g. ``selection.average_last=5``), from its checkpoints; no training.

    The test keys, ``selection`` and the override list in the run's results.json are replaced; its run
    statistics (steps, time, tokens/s) stay. Returns the new results.
    """
    run = RunDir(run_dir)
    best = run.best_or_last()
    if best is None:
        raise FileNotFoundError(f"neither best.ckpt nor last.ckpt in {run.checkpoints}: not a train.py run")
    trained_with = read_checkpoint(best)[CHECKPOINT_KEY]["config"]  # the run's whole config, resolved
    merged = OmegaConf.merge(OmegaConf.create(trained_with), OmegaConf.from_dotlist(overrides or []))
    config: dict[str, Any] = OmegaConf.to_container(merged, resolve=True)  # type: ignore[assignment]
    check_selection(config)
    previous = json.loads(run.results.read_text()) if run.results.is_file() else {}
    kept = {k: v for k, v in previous.items() if not k.startswith("test_") and k != "selection"}
    return score_run(
        run, config, Corpora.load(config["data"]), best, kept={**kept, "rescored_with": overrides or []}
    )
