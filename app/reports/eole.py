"""The equal-budget comparison with the eole peer: run both toolkits, read their results, tabulate.

``scripts/compare_with_eole.py`` is the command line. eole is run through ``../shared/peers/run_eole.sh``
(which installs it in its own virtual environment); this project through ``train.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sacrebleu

from app.reports.render import Table, markdown_table
from app.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]


def format_max_time(seconds: int) -> str:
    """Lightning's ``DD:HH:MM:SS`` for a budget in seconds."""
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"00:{hours:02d}:{minutes:02d}:{secs:02d}"


def run_eole(peers: Path, work: Path, budget_s: int, log: Path) -> dict[str, Any]:
    """Train and decode with eole; its summary.json plus lowercased BLEU of its beam-5 output."""
    env = {**os.environ, "WORK": str(work), "BUDGET": str(budget_s)}
    with log.open("w") as out:
        subprocess.run(["bash", str(peers / "run_eole.sh")], env=env, stdout=out, stderr=out, check=True)
    return read_eole(work)


def read_eole(work: Path) -> dict[str, Any]:
    """A finished eole run's summary.json, with the lowercased BLEU of its beam-5 output added."""
    run = work / "runs" / "eole_transformer"
    summary = json.loads((run / "summary.json").read_text())
    hyps = (run / "test_beam5.hyp").read_text().splitlines()
    refs = (work / "data" / "test_2016_flickr.en").read_text().splitlines()
    summary["beam5"]["BLEU_lc"] = round(sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score, 2)
    return summary


def run_ours(run_dir: Path, budget_s: int, log: Path, overrides: list[str]) -> dict[str, Any]:
    """Train this project's full recipe for the budget; its results.json."""
    command = [
        sys.executable,
        "train.py",
        "experiment=multi30k_transformer",
        f"trainer.max_time={format_max_time(budget_s)}",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    with log.open("w") as out:
        subprocess.run(command, cwd=ROOT, stdout=out, stderr=out, check=True)
    return json.loads(RunDir(run_dir).results.read_text())


def comparison_rows(eole: dict[str, Any], ours: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per toolkit with the figures both report."""
    return [
        {
            "toolkit": "eole 0.6.4",
            "params": eole["params"],
            "steps": eole["final_checkpoint_step"],
            "train_tok_s": eole["src_plus_tgt_tok_per_s"],
            "bleu": eole["beam5"]["BLEU"],
            "bleu_lc": eole["beam5"]["BLEU_lc"],
            "chrf": eole["beam5"]["chrF"],
            "decode_sent_s": eole["beam5"]["sent_per_s"],
            "peak_rss_mib": round(eole["train_peak_rss_MiB"]),
        },
        {
            "toolkit": "this project",
            "params": ours["parameters"],
            "steps": ours["global_step"],
            "train_tok_s": ours["train_tokens_per_s"],
            "bleu": ours["test_bleu"],
            "bleu_lc": ours["test_bleu_lc"],
            "chrf": ours["test_chrf"],
            "decode_sent_s": ours["test_decode_sentences_per_s"],
            "peak_rss_mib": ours["peak_rss_mb"],  # ru_maxrss / 1024: MiB
        },
    ]


COLUMNS = ("toolkit", "params", "steps", "train src+tgt tok/s", "BLEU beam 5", "BLEU lc", "chrF",
           "decode sent/s beam 5", "peak RSS MiB")  # fmt: skip


def comparison_table(rows: list[dict[str, Any]]) -> Table:
    """:func:`comparison_rows` as table text."""
    return Table(COLUMNS, [
        [r["toolkit"], f"{r['params']:,}", f"{r['steps']:,}", f"{r['train_tok_s']:,.0f}", f"{r['bleu']:.2f}",
         f"{r['bleu_lc']:.2f}", f"{r['chrf']:.1f}", f"{r['decode_sent_s']:.1f}", f"{r['peak_rss_mib']:,}"]
        for r in rows
    ])  # fmt: skip


def eole_comparison_markdown(rows: list[dict[str, Any]], budget_s: int) -> str:
    """What was compared, :func:`comparison_table`, and the ratios under it (comparison.md)."""
    eole, ours = rows
    ratio = ours["train_tok_s"] / eole["train_tok_s"]
    delta = ours["bleu"] - eole["bleu"]
    return (
        f"Multi30k de->en, {budget_s / 60:g}-minute training budget each, one after the other, "
        f"test_2016_flickr.\n\n{markdown_table(comparison_table(rows))}\n\n"
        f"Training tokens/s ratio (this project / eole): {ratio:.2f}x; BLEU difference: {delta:+.2f}.\n"
    )
