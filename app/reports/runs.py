"""One run directory, read once: what was trained, what it logged, what it scored, and how it ended.

The files of a run directory are named in :mod:`app.rundir`: the composed config, the CSV logger's rows,
``results.json`` (written when training and the test evaluation finished), the test translations, the
console log and, for a sweep job that raised, ``FAILED`` (its exit and error output, see
:func:`app.training.sweep.record_child_failure`). Every report script reads runs through :func:`read_run`;
a :class:`RunRecord` is what was read, not the training task's ``Run`` (:mod:`app.training.task`).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from app.rundir import CONFIG, RunDir

WALLCLOCK = "wallclock.csv"  # unix_time,[epoch,]step samples: runs older than the time/elapsed_min metric
ERROR_MARKERS = ("Traceback (most recent call last)", "Error executing job")


@dataclass
class RunRecord:
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
    def hypotheses(self) -> list[str] | None:
        """The test translations the run saved, one per test sentence (None for older runs); the
        committed copies under ``docs/`` keep them gzipped (``test.hyp.gz``)."""
        path = plain_or_packed(self.files.hypotheses)
        return read_text(path).splitlines() if path.is_file() else None

    def what_it_left(self) -> str:
        """One line for error messages: the files present and the error (else the last log line)."""
        files = self.files
        paths = (files.config, files.metrics, files.results, files.log, files.failed)
        present = [str(p.relative_to(self.path)) for p in paths if p.exists()]
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
    return RunDir(path).config.is_file()


def read_run(path: str | Path) -> RunRecord:
    """The run at ``path``; raises ValueError when it is no Hydra run directory."""
    files = RunDir(path)
    if not files.config.is_file():
        raise ValueError(f"{files.root} is not a Hydra run directory (no {CONFIG})")
    return RunRecord(
        path=files.root,
        config=read_config(files.config),
        metrics=read_metrics(files.root) if plain_or_packed(files.metrics).is_file() else [],
        results=json.loads(files.results.read_text()) if files.results.is_file() else None,
        log_tail=tail(files.log),
        error=files.failed.read_text(encoding="utf-8") if files.failed.is_file() else None,
    )


def error_line(text: str) -> str:
    """The line that names the error in a traceback or error output (``ValueError: ...``), else the last."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    named = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception", "Interrupt"))]
    return (named or lines or ["(no error output)"])[-1]


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


def plain_or_packed(plain: Path) -> Path:
    """``plain``, or ``plain.gz`` where only that is there (the committed run records under ``docs/``
    keep their test translations and metrics gzipped)."""
    packed = plain.with_name(f"{plain.name}.gz")
    return packed if not plain.is_file() and packed.is_file() else plain


def read_text(path: Path) -> str:
    """A UTF-8 text file, gunzipped when its name ends in ``.gz``."""
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Rows of ``<run>/csv/metrics.csv`` (or its gzipped copy) with the numeric cells only."""
    with io.StringIO(read_text(plain_or_packed(RunDir(run_dir).metrics))) as handle:
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
