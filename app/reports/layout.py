"""Where a run's parts are stored: a run directory, or a compact record that packs many runs in two files.

A run directory (:mod:`app.rundir`) holds one file per part: the composed config, the command line, the
metrics CSV, ``results.json``, the log, ``FAILED`` and the test translations. A live sweep writes one such
directory per job, and that is the layout to work in. A committed record (``docs/results/<run>``,
``docs/ablation/<sweep>``, see :mod:`app.reports.record`) keeps the same texts compact, because a sweep of
56 jobs is over 300 small files and their configs are near copies of each other::

    <record>/runs.jsonl.gz         one JSON line per job: {"job", "config", "overrides", "results",
                                   "metrics", "log", "failed"}, the texts as the job's files held them
                                   (results parsed), null where a file was absent
    <record>/hypotheses.jsonl.gz   a header line {"jobs": [...], "lines": [...]} naming the jobs that kept
                                   test translations and how many lines each has, then one JSON list per
                                   test line: that line's translation by each job (null past a job's end)

The translations of one test sentence by every job sit side by side, so gzip finds their repeats within
its 32 KB window (seeds and variants translate alike): a sweep's translations take about half the bytes
of one gzipped file per job. The record's other files (report, figures, measurement caches, extras such
as a zero-shot translation) stay beside them as they are.

A job keeps the name its directory had (``.`` for a record that is one run), and readers address it as
``<record>/<job>`` as before, so the measurement caches keyed by run paths (``decode_speed.json``,
``attention_maps.json``) still match and a report regenerates byte for byte.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from app.rundir import CONFIG, FAILED, LOG, METRICS, RESULTS, RunDir

RUNS = "runs.jsonl.gz"
HYPOTHESES_PACKED = "hypotheses.jsonl.gz"
OVERRIDES = CONFIG.parent / "overrides.yaml"
THIS_RUN = "."  # the job name of a record that is one run


@dataclass(frozen=True)
class RunParts:
    """A run's parts as its files held them (texts, ``results`` parsed); None where a file was absent."""

    config: str
    overrides: str | None = None
    results: dict[str, Any] | None = None
    metrics: str | None = None  # the CSV text
    log: str | None = None
    failed: str | None = None

    def present(self) -> list[str]:
        """The run-directory names of the parts it has, for messages about what a run left."""
        names = {"config": CONFIG, "overrides": OVERRIDES, "results": RESULTS, "metrics": METRICS,
                 "log": LOG, "failed": FAILED}  # fmt: skip
        return [str(names[key]) for key, value in asdict(self).items() if value is not None]


@dataclass(frozen=True)
class StoredRun:
    """One run as stored: the path the reports address it by, its parts, and its test translations (read
    only when asked for: a sweep's are the bulk of its record)."""

    path: Path
    parts: RunParts
    hypotheses_file: Path  # test.hyp(.gz), or the record's hypotheses.jsonl.gz
    read_hypotheses: Callable[[], list[str] | None] = field(repr=False, compare=False)


def plain_or_packed(plain: Path) -> Path:
    """``plain``, or ``plain.gz`` where only that is there (records made before the compact form keep
    their test translations and metrics gzipped)."""
    packed = plain.with_name(f"{plain.name}.gz")
    return packed if not plain.is_file() and packed.is_file() else plain


def read_text(path: Path) -> str:
    """A UTF-8 text file, gunzipped when its name ends in ``.gz``."""
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")


def _optional_text(path: Path) -> str | None:
    return read_text(path) if path.is_file() else None


def dir_parts(run: Path) -> RunParts | None:
    """The parts of the run directory ``run``; None when it is none (no composed config)."""
    files = RunDir(run)
    if not files.config.is_file():
        return None
    results = _optional_text(files.results)
    return RunParts(
        config=read_text(files.config),
        overrides=_optional_text(run / OVERRIDES),
        results=json.loads(results) if results is not None else None,
        metrics=_optional_text(plain_or_packed(files.metrics)),
        log=_optional_text(files.log),
        failed=_optional_text(files.failed),
    )


def dir_hypotheses(run: Path) -> list[str] | None:
    """The test translations of the run directory ``run``, one per line; None when it kept none."""
    text = _optional_text(plain_or_packed(RunDir(run).hypotheses))
    return text.splitlines() if text is not None else None


def is_compact(record: Path) -> bool:
    return (Path(record) / RUNS).is_file()


class CompactRecord:
    """A compact record's jobs and translations, each file read once, when first asked for."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @cached_property
    def jobs(self) -> dict[str, RunParts]:
        """Every job's parts, by job name, in the order written (sorted by name)."""
        jobs = {}
        for line in read_text(self.root / RUNS).splitlines():
            entry = json.loads(line)
            job = entry.pop("job")
            jobs[job] = RunParts(**entry)
        return jobs

    @cached_property
    def hypotheses(self) -> dict[str, list[str]]:
        """The test translations of the jobs that kept them, by job name."""
        path = self.root / HYPOTHESES_PACKED
        if not path.is_file():
            return {}
        header, *rows = (json.loads(line) for line in read_text(path).splitlines())
        return {
            job: [row[column] for row in rows[:count]]
            for column, (job, count) in enumerate(zip(header["jobs"], header["lines"], strict=True))
        }

    def run(self, job: str) -> StoredRun:
        return StoredRun(
            path=self.root / job,
            parts=self.jobs[job],
            hypotheses_file=self.root / HYPOTHESES_PACKED,
            read_hypotheses=lambda: self.hypotheses.get(job),
        )


def _dir_run(run: Path) -> StoredRun | None:
    parts = dir_parts(run)
    if parts is None:
        return None
    hyps = plain_or_packed(RunDir(run).hypotheses)
    return StoredRun(path=run, parts=parts, hypotheses_file=hyps, read_hypotheses=lambda: dir_hypotheses(run))


def _own_run(path: Path) -> StoredRun | None:
    """The run stored at ``path`` itself: a run directory or a compact record of one run."""
    if (run := _dir_run(path)) is not None:
        return run
    if is_compact(path) and THIS_RUN in (packed := CompactRecord(path)).jobs:
        return packed.run(THIS_RUN)
    return None


def stored_run(path: str | Path) -> StoredRun | None:
    """The one run at ``path``: a run directory, a compact record of one run, or ``<record>/<job>`` for a
    job of a compact record; None when ``path`` is none of these (a sweep, say)."""
    path = Path(path)
    if (run := _own_run(path)) is not None:
        return run
    if is_compact(path.parent) and path.name in (packed := CompactRecord(path.parent)).jobs:
        return packed.run(path.name)
    return None


def stored_runs(path: str | Path) -> list[StoredRun]:
    """Every run at ``path``, sorted by name: the run itself, or a compact record's jobs and the runs in
    its directories (job directories of a live sweep, or one-run records kept into a sweep's record)."""
    path = Path(path)
    if (run := stored_run(path)) is not None:
        return [run]
    runs = []
    if is_compact(path):
        packed = CompactRecord(path)
        runs += [packed.run(job) for job in packed.jobs]
    if path.is_dir():
        runs += [run for p in path.iterdir() if p.is_dir() and (run := _own_run(p)) is not None]
    return sorted(runs, key=lambda run: run.path)


# --- writing ---------------------------------------------------------------------------------------


def _job_dirs(record: Path) -> dict[str, Path]:
    """The run directories a record holds, by job name: itself (``.``) and its job directories."""
    jobs = {THIS_RUN: record} if dir_parts(record) is not None else {}
    jobs |= {p.name: p for p in sorted(record.iterdir()) if p.is_dir() and dir_parts(p) is not None}
    return jobs


def _gzip_lines(lines: Iterator[str]) -> bytes:
    """JSON lines gzipped with mtime 0 and no file name: the same record gives the same bytes."""
    return gzip.compress("".join(f"{line}\n" for line in lines).encode("utf-8"), 9, mtime=0)


def _runs_lines(parts: dict[str, RunParts]) -> Iterator[str]:
    for job, run in parts.items():
        yield json.dumps({"job": job, **asdict(run)}, ensure_ascii=False)


def _hypotheses_lines(hyps: dict[str, list[str]]) -> Iterator[str]:
    jobs = list(hyps)
    yield json.dumps({"jobs": jobs, "lines": [len(hyps[job]) for job in jobs]}, ensure_ascii=False)
    for i in range(max(map(len, hyps.values()), default=0)):
        row = [lines[i] if i < len(lines) else None for lines in hyps.values()]
        yield json.dumps(row, ensure_ascii=False)


def write_compact(record: Path, parts: dict[str, RunParts], hyps: dict[str, list[str]]) -> list[Path]:
    """Write ``parts`` (by job name) and the jobs' translations ``hyps`` as a compact record in
    ``record``; returns the files written (relative to it)."""
    written = [Path(RUNS)]
    (record / RUNS).write_bytes(_gzip_lines(_runs_lines(parts)))
    if hyps:
        (record / HYPOTHESES_PACKED).write_bytes(_gzip_lines(_hypotheses_lines(hyps)))
        written.append(Path(HYPOTHESES_PACKED))
    return written


def unpack_hypotheses(record: str | Path) -> list[Path]:
    """Write each job's test translations of the compact record ``record`` where its run directory held
    them, ``<record>/test.hyp`` (a record of one run) or ``<record>/<job>/test.hyp``, for tools that read
    files (``sacrebleu -i``); returns the files written. Git ignores them."""
    packed = CompactRecord(record)
    written = []
    for job, lines in packed.hypotheses.items():
        path = RunDir(packed.root / job).hypotheses
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        written.append(path)
    return written


def _packed_files(run: Path) -> list[Path]:
    """The files of run directory ``run`` that a compact record holds (the others stay)."""
    files = RunDir(run)
    names = (files.config, run / OVERRIDES, files.results, plain_or_packed(files.metrics), files.log,
             files.failed, plain_or_packed(files.hypotheses))  # fmt: skip
    return [path for path in names if path.is_file()]


def _remove(run: Path, record: Path) -> None:
    """Remove ``run``'s packed files, then the directories they leave empty (never ``record``)."""
    for path in _packed_files(run):
        path.unlink()
    for directory in (run / CONFIG.parent, run / METRICS.parent, run):
        if directory != record and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()


def compact(record: str | Path) -> list[Path]:
    """Pack the run directories of ``record`` (itself, or its job directories) into its compact files,
    check that every part and translation reads back the same, then remove the packed files; returns
    the files written (relative to ``record``). Other files stay. Raises ValueError when ``record``
    holds no run directory or is compact already."""
    record = Path(record)
    if is_compact(record):
        raise ValueError(f"{record} is compact already ({RUNS})")
    jobs = _job_dirs(record) if record.is_dir() else {}
    if not jobs:
        raise ValueError(f"{record} holds no run directory (no {CONFIG} in it or in a directory in it)")
    parts = {job: dir_parts(path) for job, path in jobs.items()}
    hyps = {job: lines for job, path in jobs.items() if (lines := dir_hypotheses(path)) is not None}
    written = write_compact(record, parts, hyps)  # type: ignore[arg-type]  # every job has parts
    try:
        packed = CompactRecord(record)
        same = packed.jobs == parts and packed.hypotheses == hyps
    except Exception:
        same = False
    if not same:
        for path in written:
            (record / path).unlink()
        raise RuntimeError(f"{record}: the compact files do not read back as written; nothing removed")
    for path in jobs.values():
        _remove(path, record)
    return written
