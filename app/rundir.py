"""The run directory's layout: every file a training run writes and a reader reads, named once.

A run directory is Hydra's output directory for one ``train.py`` job (and each committed copy under
``docs/results/<run>/``). Writers (the training task, the sweep launcher) and readers (rescoring, the
reports, the eole comparison) reach its files through :class:`RunDir` instead of spelling the names::

    <run>/.hydra/config.yaml      the composed config
    <run>/csv/metrics.csv         the CSV logger's rows
    <run>/train.log               the console log (rank 0)
    <run>/results.json            test scores, written when training and the test evaluation finished
    <run>/test.hyp                the test-set translations, one per line, written with results.json
    <run>/FAILED                  a sweep job that raised: its exit and the end of its error output
    <run>/recipe.json             scripts/quickstart.py's choice of experiment, why, and what it measured
    <run>/checkpoints/best.ckpt   best by the validation metric
    <run>/checkpoints/last.ckpt   the newest state (resume starts here)
    <run>/checkpoints/step-0001200.ckpt   every N steps, the newest ``checkpoint.keep_last`` kept
    <run>/checkpoints/averaged.ckpt       ``selection.average_last``'s candidate
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG = Path(".hydra") / "config.yaml"
METRICS = Path("csv") / "metrics.csv"
LOG = "train.log"
RESULTS = "results.json"
HYPOTHESES = "test.hyp"
FAILED = "FAILED"
RECIPE = "recipe.json"
CHECKPOINTS = "checkpoints"
BEST = "best.ckpt"
LAST = "last.ckpt"
AVERAGED = "averaged.ckpt"
STEP_STEM = "step-{step:07d}"  # Lightning's ModelCheckpoint filename pattern (no suffix)


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory; nothing is read or created by building one."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def log(self) -> Path:
        return self.root / LOG

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def hypotheses(self) -> Path:
        return self.root / HYPOTHESES

    @property
    def failed(self) -> Path:
        return self.root / FAILED

    @property
    def recipe(self) -> Path:
        return self.root / RECIPE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST

    @property
    def averaged(self) -> Path:
        return self.checkpoints / AVERAGED

    def best_or_last(self) -> Path | None:
        """``best.ckpt`` where validation chose one, else ``last.ckpt``; None when neither exists."""
        return next((p for p in (self.best, self.last) if p.is_file()), None)
