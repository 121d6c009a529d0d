"""A Markdown table of runs: the model and attention each used, its test scores and costs.

A multilingual run (``test_directions`` in results.json) shows the mean over its directions in its own
row, then one row per direction (``run de-en``) with that direction's scores.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from app.reports.render import Table, markdown_table
from app.reports.runs import RunRecord
from app.reports.variants import attention_name

COLUMNS = (
    "run",
    "model",
    "attention",
    "params",
    "BLEU",
    "BLEU lc",
    "chrF",
    "steps",
    "train min",
    "train tok/s",
    "test sent/s",
    "peak RSS MB",
    "BLEU lc Moses",
    "decoded with",
)


def describe_model(model: dict[str, Any]) -> str:
    name = str(model.get("family", "transformer"))
    if "cell" in model:
        return f"{name} {model['cell']}"
    return name


def summary_row(run: RunRecord) -> list[str]:
    """The table cells of one run; a run without results is marked with its status."""
    cells = [
        run.name,
        describe_model(run.config.get("model", {})),
        attention_name(run.config.get("attention", {})),
    ]
    r = run.results
    if r is None:
        status = "unfinished" if run.status == "missing" else run.status
        return [*cells, status] + [""] * (len(COLUMNS) - len(cells) - 1)
    return [
        *cells,
        f"{r['parameters'] / 1e6:.2f}M",
        f"{r['test_bleu']:.2f}",
        f"{r['test_bleu_lc']:.2f}",
        f"{r['test_chrf']:.1f}",
        str(r.get("global_step", "")),
        f"{r['fit_seconds'] / 60:.1f}" if "fit_seconds" in r else "",
        f"{r['train_tokens_per_s']:,}" if "train_tokens_per_s" in r else "",
        f"{r['test_decode_sentences_per_s']:.1f}" if "test_decode_sentences_per_s" in r else "",
        f"{r['peak_rss_mb']:,}" if "peak_rss_mb" in r else "",
        f"{r['test_bleu_moses_lc']:.2f}" if "test_bleu_moses_lc" in r else "",
        describe_decoding(r),
    ]


def direction_rows(run: RunRecord) -> list[list[str]]:
    """A multilingual run's rows per direction: name, scores (BLEU, BLEU lc, chrF, BLEU lc Moses)."""
    r = run.results or {}
    rows = []
    for direction in r.get("test_directions", []):
        row = [f"{run.name} {direction}"] + [""] * (len(COLUMNS) - 1)
        for column, key, digits in (
            ("BLEU", "test_bleu", 2),
            ("BLEU lc", "test_bleu_lc", 2),
            ("chrF", "test_chrf", 1),
            ("BLEU lc Moses", "test_bleu_moses_lc", 2),
        ):
            value = r.get(f"{key}/{direction}")
            row[COLUMNS.index(column)] = "" if value is None else f"{value:.{digits}f}"
        rows.append(row)
    return rows


def describe_decoding(results: dict[str, Any]) -> str:
    """What decoded the test set: ``averaged, beam 5, alpha 1.0`` (alpha left out by older runs)."""
    if "checkpoint" not in results:
        return ""
    parts = [PurePath(results["checkpoint"]).stem, f"beam {results['beam']}"]
    if "alpha" in results:
        parts.append(f"alpha {results['alpha']}")
    return ", ".join(parts)


def summary_table(runs: list[RunRecord]) -> Table:
    """One row per run, in the order given."""
    return Table(COLUMNS, [row for run in runs for row in (summary_row(run), *direction_rows(run))])


def summary_markdown(runs: list[RunRecord]) -> str:
    return markdown_table(summary_table(runs))
