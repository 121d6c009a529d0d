"""One run, read once: what was trained, what it logged, what it scored, and how it ended.

A run is stored as a run directory (:mod:`app.rundir`: the composed config, the CSV logger's rows,
``results.json`` (written when training and the test evaluation finished), the test translations, the
console log and, for a sweep job that raised, ``FAILED``, see :func:`app.training.sweep.record_child_failure`)
or as one job of a compact record (:mod:`app.reports.layout`, the form committed under ``docs/``). Every
report script reads runs through :func:`read_run` and :func:`read_runs`, which take either; a
:class:`RunRecord` is what was read, not the training task's ``Run`` (:mod:`app.training.task`).
"""

from __future__ import annotations

import csv
import io
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from app.reports.layout import StoredRun, dir_hypotheses, plain_or_packed, read_text, stored_run, stored_runs
from app.rundir import CONFIG, RunDir

__all__ = ["RunRecord", "is_run_dir", "plain_or_packed", "read_run", "read_runs", "read_text"]

WALLCLOCK = "wallclock.csv"  # unix_time,[epoch,]step samples: runs older than the time/elapsed_min metric
ERROR_MARKERS = ("Traceback (most recent call last)", "Error executing job")


@dataclass
class RunRecord:
    """A run's contents, from its directory or its compact record; missing parts read as empty (see
    :attr:`status`)."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, float]] = field(repr=False)
    results: dict[str, Any] | None
    log_tail: str = field(repr=False)  # the last lines of train.log, to say why a run failed
    error: str | None = field(default=None, repr=False)  # the FAILED file: how the job ended, its stderr
    stored: StoredRun | None = field(default=None, repr=False, compare=False)  # where it was read from

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def files(self) -> RunDir:
        """Where the run's files are (checkpoints included)."""
        return RunDir(self.path)

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
    def step_tokens_per_s(self) -> float | None:
        """Training tokens per second of the steps alone: the median of the logged ``train/tokens_per_s``
        (one value per logging interval). results.json's ``train_tokens_per_s`` divides by the whole fit,
        validation included, which at long inputs can be most of it (an untrained model decodes to the
        length limit), so it ranks kernels by their decoding as much as by their training."""
        rates = [row["train/tokens_per_s"] for row in self.metrics if "train/tokens_per_s" in row]
        return statistics.median(rates) if rates else None

    @property
    def stored_as(self) -> StoredRun | None:
        """Where the run was read from; looked up for a record built by hand (``scripts/plot_curves.py``)."""
        return self.stored or stored_run(self.path)

    @property
    def hypotheses(self) -> list[str] | None:
        """The test translations the run saved, one per test sentence (None for older runs), read from
        its directory (``test.hyp``, or ``test.hyp.gz``) or its compact record."""
        stored = self.stored_as
        return stored.read_hypotheses() if stored is not None else dir_hypotheses(self.path)

    @property
    def hypotheses_file(self) -> Path:
        """The file its translations are (or would be) read from, for messages."""
        stored = self.stored_as
        return stored.hypotheses_file if stored is not None else plain_or_packed(self.files.hypotheses)

    def what_it_left(self) -> str:
        """One line for error messages: the parts present and the error (else the last log line)."""
        stored = self.stored_as
        present = stored.parts.present() if stored is not None else []
        if self.error:
            return f"{self.path}: {self.status}; error: {error_line(self.error)}"
        last = self.log_tail.strip().splitlines()[-1:] or ["(no train.log)"]
        return f"{self.path}: {self.status}; files: {', '.join(present) or 'none'}; last log line: {last[0]}"


def describe_machine(results: dict[str, Any], who: str = "this run") -> str:
    """Where a run trained (results.json ``machine``): ``cuda, AMD EPYC (16 threads), torch 2.13.0``; runs
    from before that record say where they decoded the test set."""
    machine = results.get("machine")
    if not machine:
        return f"not recorded by {who} (test decoded on {results.get('test_decode_device', '?')})"
    accelerator = "" if machine["device"] == "cpu" else f"{machine['device']}, "
    return f"{accelerator}{machine['cpu_model']} ({machine['threads']} threads), torch {machine['torch']}"


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is one run: a run directory, a compact record of one run, or one job of a
    compact record (``<record>/<job>``)."""
    return stored_run(path) is not None


def read_run(path: str | Path) -> RunRecord:
    """The run at ``path`` (see :func:`is_run_dir`); raises ValueError when it is no run."""
    stored = stored_run(path)
    if stored is None:
        raise ValueError(f"{path} is not a Hydra run directory (no {CONFIG}) nor a job of a compact record")
    return record_of(stored)


def read_runs(path: str | Path) -> list[RunRecord]:
    """Every run at ``path``, sorted by name: one run, a compact record's jobs, or a sweep's jobs."""
    return [record_of(stored) for stored in stored_runs(path)]


def record_of(stored: StoredRun) -> RunRecord:
    """The :class:`RunRecord` of a stored run: its config resolved, metrics parsed, log's tail."""
    parts = stored.parts
    return RunRecord(
        path=stored.path,
        config=parse_config(parts.config),
        metrics=parse_metrics(parts.metrics) if parts.metrics is not None else [],
        results=parts.results,
        log_tail=tail(parts.log),
        error=parts.failed,
        stored=stored,
    )


def error_line(text: str) -> str:
    """The line that names the error in a traceback or error output (``ValueError: ...``), else the last."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception", "Interrupt"))]
    return (named or lines or ["(no error output)"])[-1]


def parse_config(text: str) -> dict[str, Any]:
    """A run's saved config (the YAML text) with every section resolved that can be outside Hydra.

    Interpolations between sections (``attention.num_kv_heads: ${heads.num_kv_heads}``) are resolved;
    values that need Hydra's own resolvers (``output_dir: ${hydra:...}``) stay as written.
    """
    loaded = OmegaConf.create(text)
    config = OmegaConf.to_container(loaded, resolve=False)
    for key in config:
        try:
            value = loaded[key]  # reading a scalar resolves it
            config[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        except Exception:  # an interpolation only Hydra can resolve: keep the text
            continue
    return config


def tail(text: str | None, lines: int = 40) -> str:
    """The last ``lines`` lines of a log ("" without one)."""
    return "\n".join((text or "").splitlines()[-lines:])


def parse_metrics(text: str) -> list[dict[str, float]]:
    """The CSV logger's rows with the numeric cells only."""
    with io.StringIO(text) as handle:
        return [
            {k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)
        ]


def read_metrics(run: Path) -> list[dict[str, float]]:
    """The metrics rows of the run at ``run``: a run's or a compact record's job (see :func:`read_run`),
    else ``<run>/csv/metrics.csv`` (or its gzipped copy) alone, as some older records keep it."""
    stored = stored_run(run)
    if stored is not None and stored.parts.metrics is not None:
        return parse_metrics(stored.parts.metrics)
    return parse_metrics(read_text(plain_or_packed(RunDir(run).metrics)))


def series(rows: list[dict[str, float]], x: str, y: str) -> tuple[list[float], list[float]]:
    """The (x, y) points of the rows that carry both columns, in logged order."""
    points = [(row[x], row[y]) for row in rows if x in row and y in row]
    return [p[0] for p in points], [p[1] for p in points]


def minutes_from_wallclock(run_dir: Path, steps: list[float]) -> list[float] | None:
    """Minutes since the first sample at which each step was reached, interpolated from ``wallclock.csv``
    (rows ``unix_time,[epoch,]step`` that runs older than the ``time/elapsed_min`` metric carry)."""
    path = run_dir / WALLCLOCK
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
