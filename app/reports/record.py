"""A run record: what a reader needs of one finished run, small enough to commit (docs/results/).

``keep_run(run, record)`` keeps from a run directory (:class:`app.rundir.RunDir`) its composed config
and command line (``.hydra/config.yaml``, ``overrides.yaml``), ``results.json``, the logged metrics, the
test translations and the console log, shortened to its first and last lines when long, all packed in
the record's compact files (:mod:`app.reports.layout`: ``runs.jsonl.gz``, ``hypotheses.jsonl.gz``;
every reader here takes a record as it takes a run directory). Extra files the run holds (a zero-shot
translation, say) are kept beside them when named, gzipped. Checkpoints never are.

``keep_sweep(sweep, record)`` does the same for a whole Hydra sweep (docs/ablation/<name>/): every job's
parts (a failed or unfinished job's config, ``FAILED`` file and log, so the report names it) in the same
two files, and the sweep's own report files, figures and measurement caches (``decode_speed.json``,
``attention_maps.json``), so ``scripts/report.py <record>`` regenerates the report without checkpoints.

The record is assembled in a temporary directory beside its destination and renamed into place, so an
interrupted copy leaves nothing half-made; an existing record is never overwritten. ``compact_record``
packs a record written job by job (before the compact form) in place.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from app.reports.layout import compact
from app.rundir import CONFIG, FAILED, HYPOTHESES, LOG, METRICS, RESULTS, RunDir

LOG_HEAD, LOG_TAIL = 30, 50  # lines of a long log a record keeps
OVERRIDES = CONFIG.parent / "overrides.yaml"
GZIPPED = (METRICS, Path(HYPOTHESES))  # kept as <name>.gz
SWEEP_FILES = (  # a sweep's own files a record keeps (report.html is rebuilt, never committed)
    "multirun.yaml", "report.md", "report.csv", "report.json", "decode_speed.json", "attention_maps.json",
)  # fmt: skip


class RecordError(ValueError):
    """A run that cannot be recorded (unfinished, or not a run), or a record that already exists."""


def keep_run(run: str | Path, record: str | Path, *, extra: Sequence[str] = ()) -> list[Path]:
    """Write the record of finished ``run`` to ``record``; returns the files written (relative paths)."""
    source, record = RunDir(run), Path(record)
    for needed in (source.config, source.results):
        if not needed.is_file():
            raise RecordError(f"{run} is not a finished run: {needed} does not exist")
    return _assemble(record, lambda tmp: _copy_parts(source.root, tmp, extra))


def keep_sweep(sweep: str | Path, record: str | Path) -> list[Path]:
    """Write the record of ``sweep`` (a Hydra sweep directory) to ``record``; returns the files written.

    Every job directory (one holding ``.hydra/config.yaml``) is kept as :func:`keep_run` keeps a run,
    finished or not (a failed job keeps its ``FAILED`` file), beside the sweep's :data:`SWEEP_FILES` and
    PNG figures."""
    source = Path(sweep)
    jobs = sorted(p for p in source.iterdir() if RunDir(p).config.is_file()) if source.is_dir() else []
    if not jobs:
        raise RecordError(
            f"{sweep} is neither a finished run nor a sweep: no {CONFIG} in it or in a directory in it"
        )

    def copy(out: Path) -> list[Path]:
        written = []
        for job in jobs:
            written += [Path(job.name) / part for part in _copy_parts(job, out / job.name, ())]
        for path in sorted(source.iterdir()):
            if path.is_file() and (path.name in SWEEP_FILES or path.suffix == ".png"):
                written.append(_copy(path, out / path.name).relative_to(out))
        return written

    return _assemble(Path(record), copy)


def compact_record(record: str | Path) -> list[Path]:
    """Pack the record ``record``, written job by job, into its compact files in place (see
    :func:`app.reports.layout.compact`); returns the files written."""
    try:
        return compact(record)
    except ValueError as err:
        raise RecordError(str(err)) from err


def _assemble(record: Path, copy: Callable[[Path], list[Path]]) -> list[Path]:
    """``copy(tmp)`` into a temporary directory beside ``record``, packed in its compact files and
    renamed to ``record`` when complete; returns the files the record holds."""
    if record.exists():
        raise RecordError(f"{record} exists; choose another name or remove it first")
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=record.parent, prefix=f".{record.name}-"))
    try:
        copy(tmp)
        compact(tmp)
        written = sorted(p.relative_to(tmp) for p in tmp.rglob("*") if p.is_file())
        tmp.rename(record)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def _copy_parts(run: Path, out: Path, extra: Sequence[str]) -> list[Path]:
    written = []
    for name in (CONFIG, OVERRIDES, Path(RESULTS), Path(FAILED)):  # FAILED: a failed sweep job
        if (run / name).is_file():
            written.append(_copy(run / name, out / name))
    for name in (*GZIPPED, *(Path(e) for e in extra)):
        path = run / name
        if path.is_file():
            written.append(_gzip(path, out / f"{name}.gz"))
        elif name not in GZIPPED:
            raise RecordError(f"{path} does not exist (named with --extra)")
    if (run / LOG).is_file():
        written.append(_short_log(run / LOG, out / LOG))
    return [path.relative_to(out) for path in written]


def _copy(path: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, dest)
    return dest


def _gzip(path: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with path.open("rb") as src, gzip.GzipFile(dest, "wb", mtime=0) as out:
        shutil.copyfileobj(src, out)  # mtime=0: the same run gives the same bytes
    return dest


def _short_log(path: Path, dest: Path) -> Path:
    """The log as it is, or its first :data:`LOG_HEAD` and last :data:`LOG_TAIL` lines with a note."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    if len(lines) > LOG_HEAD + LOG_TAIL:
        left_out = len(lines) - LOG_HEAD - LOG_TAIL
        note = f"[... {left_out} of {len(lines)} lines left out, first {LOG_HEAD} and last {LOG_TAIL} kept]\n"
        lines = [*lines[:LOG_HEAD], note, *lines[-LOG_TAIL:]]
    dest.write_text("".join(lines), encoding="utf-8")
    return dest
