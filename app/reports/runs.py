"""One run directory, read once: what was trained, what it logged, what it scored, and how it ended.

A Hydra run directory (and each committed copy under ``docs/results/<run>/``) holds
``.hydra/config.yaml`` (the composed config), ``csv/metrics.csv`` (the CSV logger's rows),
``results.json`` (written when training and the test evaluation finished), ``test.hyp`` (the test
translations), ``train.log`` and, for a sweep job that raised, ``FAILED`` (its exit and error output, see
:func:`app.training.sweep.record_child_failure`). Every report script reads runs through :func:`read_run`.
"""

from __future__ import annotations

import csv
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

CONFIG = Path(".hydra") / "config.yaml"
METRICS = Path("csv") / "metrics.csv"
RESULTS = "results.json"
HYPOTHESES = "test.hyp"
LOG = "train.log"
FAILED = "FAILED"  # a sweep job failed (its exit and error output); the sweep went on (app/training/sweep.py)
ERROR_MARKERS = ("Traceback (most recent call last)", "Error executing job")


@dataclass
class Run:
    """A run directory's contents; missing files read as empty (see :attr:`status`)."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, float]] = field(repr=False)
    results: dict[str, Any] | None
    log_tail: str = field(repr=False)  # the last lines of train.log, to say why a run failed
    error: str | None = field(default=None, repr=False)  # the FAILED file: how the job ended, its stderr

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def status(self) -> str:
        """``finished`` (results.json written), ``failed`` (a FAILED file or an error in train.log),
        ``missing`` (neither: killed, still running, or never started)."""
        if self.results is not None:
            return "finished"
        if self.error is not None or any(marker in self.log_tail for marker in ERROR_MARKERS):
            return "failed"
        return "missing"

    @property
    def hypotheses(self) -> list[str] | None:
        """The test translations the run saved, one per test sentence (None for older runs); the
        committed copies under ``docs/`` keep them gzipped (``test.hyp.gz``)."""
        path = self.path / HYPOTHESES
        if path.is_file():
            return path.read_text(encoding="utf-8").splitlines()
        packed = self.path / f"{HYPOTHESES}.gz"
        return gzip.decompress(packed.read_bytes()).decode("utf-8").splitlines() if packed.is_file() else None

    def what_it_left(self) -> str:
        """One line for error messages: the files present and the error (else the last log line)."""
        files = (CONFIG, METRICS, Path(RESULTS), Path(LOG), Path(FAILED))
        present = [str(p) for p in files if (self.path / p).exists()]
        if self.error:
            return f"{self.path}: {self.status}; error: {error_line(self.error)}"
        last = self.log_tail.strip().splitlines()[-1:] or ["(no train.log)"]
        return f"{self.path}: {self.status}; files: {', '.join(present) or 'none'}; last log line: {last[0]}"


def is_run_dir(path: Path) -> bool:
    return (path / CONFIG).is_file()


def read_run(path: str | Path) -> Run:
    """The run at ``path``; raises ValueError when it is no Hydra run directory."""
    path = Path(path)
    if not is_run_dir(path):
        raise ValueError(f"{path} is not a Hydra run directory (no {CONFIG})")
    config = read_config(path / CONFIG)
    results_file = path / RESULTS
    return Run(
        path=path,
        config=config,
        metrics=read_metrics(path) if metrics_file(path).is_file() else [],
        results=json.loads(results_file.read_text()) if results_file.is_file() else None,
        log_tail=tail(path / LOG),
        error=(path / FAILED).read_text(encoding="utf-8") if (path / FAILED).is_file() else None,
    )


def error_line(text: str) -> str:
    """The line that names the error in a traceback or error output (``ValueError: ...``), else the last."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception", "Interrupt"))]
    return (named or lines or ["(no error output)"])[-1]


def clear_failure(run_dir: Path) -> None:
    """Remove the FAILED file of an earlier attempt (a resumed sweep runs the job again)."""
    (run_dir / FAILED).unlink(missing_ok=True)


def read_config(path: Path) -> dict[str, Any]:
    """A run's saved config with every section resolved that can be outside Hydra.

    Interpolations between sections (``attention.num_kv_heads: ${heads.num_kv_heads}``) are resolved;
    values that need Hydra's own resolvers (``output_dir: ${hydra:...}``) stay as written.
    """
    loaded = OmegaConf.load(path)
    config = OmegaConf.to_container(loaded, resolve=False)
    for key in config:
        try:
            value = loaded[key]  # reading a scalar resolves it
            config[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:  # an interpolation only Hydra can resolve: keep the text
            continue
    return config


def tail(path: Path, lines: int = 40) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def metrics_file(run_dir: Path) -> Path:
    """``<run>/csv/metrics.csv``, or ``metrics.csv.gz`` where only that is there (the committed copies
    under ``docs/`` keep it gzipped)."""
    plain = run_dir / METRICS
    packed = plain.with_name(f"{plain.name}.gz")
    return packed if not plain.is_file() and packed.is_file() else plain


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Rows of ``<run>/csv/metrics.csv`` (or its gzipped copy) with the numeric cells only."""
    path = metrics_file(run_dir)
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as handle:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)
        ]


def series(rows: list[dict[str, float]], x: str, y: str) -> tuple[list[float], list[float]]:
    """The (x, y) points of the rows that carry both columns, in logged order."""
    points = [(row[x], row[y]) for row in rows if x in row and y in row]
    return [p[0] for p in points], [p[1] for p in points]


def minutes_from_wallclock(run_dir: Path, steps: list[float]) -> list[float] | None:
    """Minutes since the first sample at which each step was reached, interpolated from ``wallclock.csv``
    (rows ``unix_time,[epoch,]step`` that runs older than the ``time/elapsed_min`` metric carry)."""
    path = run_dir / "wallclock.csv"
    if not path.is_file():
        return None
    with path.open() as handle:
        samples = [(int(row[0]), int(row[-1])) for row in csv.reader(handle) if row and row[-1].strip()]
    if not samples:
        return None
    start = samples[0][0]
    # training only moves forward: a later sample with a smaller step (e.g. the test-results row that a
    # sampler read after training) is not a point of the curve
    samples = [sample for i, sample in enumerate(samples) if all(sample[1] >= s for _, s in samples[:i])]
    times = [(t - start) / 60 for t, _ in samples]
    return [float(m) for m in np.interp(steps, [s for _, s in samples], times)]


def bleu_against_minutes(
    run_dir: Path, rows: list[dict[str, float]], column: str = "val/bleu"
) -> tuple[list[float], list[float]]:
    """Validation BLEU (``column``) by minute: the logged ``time/elapsed_min``, else ``wallclock.csv``."""
    minutes, bleu = series(rows, "time/elapsed_min", column)
    if minutes:
        return minutes, bleu
    steps, bleu = series(rows, "step", column)
    return (minutes_from_wallclock(run_dir, steps) or []), bleu
