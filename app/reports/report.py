"""The ablation report: sweep directories in, one row per variant out (report.md/.html/.csv/.json, figures).

This module assembles the report from the other reports modules: the runs grouped into variants
(:mod:`~app.reports.variants`), mean +- std over seeds and the tests against the baseline variant
(:mod:`~app.reports.significance`), KV-cache bytes, decoding speed and attention maps
(:mod:`~app.reports.measurements`), the figures (:mod:`~app.reports.figures`), and one document rendered
as Markdown and as HTML (:mod:`~app.reports.render`). ``scripts/report.py`` is its command line and
:class:`app.reports.callback.AblationReport` runs it when a sweep ends.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.inference.plot import comparison_figure
from app.reports import figures
from app.reports.decode_speed import (
    DECODE_CACHE,
    DecodeSettings,
    decode_speeds,
    describe_timing,
    output_cap,
    sweep_settings,
)
from app.reports.lengths import METRICS as LENGTH_METRICS
from app.reports.lengths import group_length, length_sections
from app.reports.measurements import (
    ATTENTION_CACHE,
    ATTENTION_SENTENCE,
    KV_LENGTH,
    attention_skipped,
    group_attention,
    kv_cache_bytes_per_token,
)
from app.reports.render import Block, Bullets, Heading, Images, MarkdownOnly, Paragraph, Table, Warnings
from app.reports.render import html as render_html
from app.reports.render import markdown as render_markdown
from app.reports.runs import describe_machine
from app.reports.significance import SAMPLES, SEED, SIGNIFICANCE, baseline_comparison, mean_std
from app.reports.uptrain import uptrain_sections
from app.reports.variants import (
    START,
    Group,
    Variant,
    describe_start,
    group_runs,
    jobs_at_a_time,
    joined,
    pick_baseline,
    sweep_runs,
    test_pairs,
)

log = logging.getLogger(__name__)

TITLE = "Ablation report"
COLUMNS = (
    "variant", "seeds", "params", "kv_bytes_per_token", "steps", "train_tokens_per_s", "step_tokens_per_s",
    "peak_rss_mb", "peak_gpu_mb", "bleu", "bleu_std", "bleu_lc", "bleu_lc_std", "chrf", "chrf_std",
    "decode_sent_s_greedy", "decode_sent_s_beam5",
    "delta_bleu", "ci95", "p_value", "significant",
    "seeds_low", "seeds_high", "p_value_seeds", "significant_seeds",
)  # fmt: skip
HEADLINE = ("variant", "params", "steps", "BLEU (mean ± std)", "vs baseline (95% CI)", "p sentences",
            "95% interval over seeds", "p seeds", "decode sent/s greedy / beam 5")  # fmt: skip
REPORT_FILES = ("report.md", "report.html", "report.csv", "report.json")
LENGTHS_PNG = "lengths.png"  # a length sweep's metrics against the input length


def variant_row(
    variant: Variant, baseline: Variant | None, references: list[str] | None, speeds: dict[str, Any]
) -> dict[str, Any]:
    """One report row (keys in :data:`COLUMNS` order): costs, mean +- std of the scores over seeds,
    decoding speed, and the tests against the baseline."""
    run = variant.runs[0]
    row: dict[str, Any] = {
        "variant": variant.name,
        "seeds": len(variant.runs),
        "params": run.results.get("parameters"),
        "kv_bytes_per_token": kv_cache_bytes_per_token(
            run.config.get("model", {}),
            run.config.get("attention", {}),
            run.config.get("trainer", {}).get("precision"),
        ),
    }
    for column, key in (
        ("steps", "global_step"),
        ("train_tokens_per_s", "train_tokens_per_s"),
        ("peak_rss_mb", "peak_rss_mb"),
        ("peak_gpu_mb", "peak_gpu_mb"),
    ):
        mean, _ = mean_std(variant.result(key))
        row[column] = round(mean) if mean is not None else None
    step_rate, _ = mean_std([rate for run in variant.runs if (rate := run.step_tokens_per_s) is not None])
    row["step_tokens_per_s"] = round(step_rate) if step_rate is not None else None
    for column in ("bleu", "bleu_lc", "chrf"):
        mean, std = mean_std(variant.result(f"test_{column}"))
        row[column] = round(mean, 2) if mean is not None else None
        row[f"{column}_std"] = round(std, 2) if std is not None else None
    speed = speeds.get(variant.name, {})
    row["decode_sent_s_greedy"], row["decode_sent_s_beam5"] = speed.get("beam1"), speed.get("beam5")
    row |= baseline_comparison(baseline, variant, references)
    return {column: row[column] for column in COLUMNS}


def cell(value: Any) -> str:
    """A row value as table text: ``-`` for none, ``*`` for significant, thousands separated."""
    if value is None:
        return "-"
    if value is True:
        return "*"
    if value is False:
        return ""
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def full_table(rows: list[dict[str, Any]]) -> Table:
    """Every column of every row."""
    return Table(COLUMNS, [[cell(row[c]) for c in COLUMNS] for row in rows])


def plus_minus(value: float | None, spread: float | None, signed: bool = False) -> str:
    if value is None:
        return ""
    text = f"{value:+.2f}" if signed else f"{value:.2f}"
    return text if spread is None else f"{text} ± {spread:.2f}"


def marked(p_value: float | None, significant: bool | None) -> str:
    """A p-value with `` *`` when significant; empty when there is none."""
    return "" if p_value is None else f"{p_value}{' *' if significant else ''}"


def headline_table(rows: list[dict[str, Any]]) -> Table:
    """The few columns a reader compares first, formatted to be quoted as is (e.g. in a README)."""
    lines = []
    for row in rows:
        low, high = row["seeds_low"], row["seeds_high"]
        lines.append([
            row["variant"],
            "-" if row["params"] is None else f"{row['params'] / 1e6:.2f}M",
            cell(row["steps"]),
            plus_minus(row["bleu"], row["bleu_std"]),
            plus_minus(row["delta_bleu"], row["ci95"], signed=True),
            marked(row["p_value"], row["significant"]),
            "" if low is None else f"{low:+.2f} .. {high:+.2f}",
            marked(row["p_value_seeds"], row["significant_seeds"]),
            f"{cell(row['decode_sent_s_greedy'])} / {cell(row['decode_sent_s_beam5'])}",
        ])  # fmt: skip
    return Table(HEADLINE, lines)


def header_lines(
    group: Group, baseline: Variant | None, speeds: dict[str, Any], attention_note: str | None = None
) -> list[str]:
    """What was held equal, how the comparison was made, which jobs are missing."""
    budget = {k.removeprefix("trainer."): v for k, v in group.held["budget"].items() if v is not None}
    lines = [
        f"data: {json.dumps(group.held['data'], default=str)}",
        f"model size: {json.dumps(group.held['model size'], default=str)}",
        f"budget: {json.dumps(budget)} (training stops at whichever is reached first)",
    ]
    if group.held.get("input length"):  # a length sweep's group (older runs have no data.concat)
        lines.append(f"input length: {group_length(group)} sentence pair(s) per example (data.concat)")
    if group.held.get(START):
        lines.append(f"start: {describe_start(group.held[START])}")
    lines += [
        f"trained on: {trained_on(group)}",
        f"decoding speed: {describe_timing(speeds)}",
        *([f"attention maps: {attention_note}"] if attention_note else []),
        "train_tokens_per_s: source + target tokens over the whole fit, validation included; "
        "step_tokens_per_s: over the training steps alone (the median of the logged train/tokens_per_s), "
        "what the length tables and the crossovers compare",
        f"kv_bytes_per_token: decoder self-attention cache bytes per generated token, all layers, "
        f"averaged over a {KV_LENGTH}-token output (each kernel's cache_bytes; window and fixed-state "
        "kernels grow less)",
        f"baseline: {baseline.name if baseline else 'none'}; difference: cased test BLEU, sacreBLEU paired "
        f"bootstrap ({SAMPLES} resamples, seed {SEED}) pooled over the seeds both "
        f"variants finished; ci95 = half-width of the variant's 95% interval; * = p < {SIGNIFICANCE}",
        "p seeds: a two-level bootstrap (app/reports/significance.py) that resamples the seeds of each "
        "variant as well as the test sentences, so it asks whether the *recipes* differ, not only these "
        "trained systems; its 95% interval is of the difference in cased BLEU",
    ]
    single = [v.name for v in group.variants if len(v.runs) < 2]
    if single:
        lines.append(f"single seed (no std, no p-value): {', '.join(single)}")
    lines += [f"{run.status} job: {run.what_it_left()}" for run in group.incomplete]
    return lines


def trained_on(group: Group) -> str:
    """The machines the group's runs recorded (results.json ``machine``), and how many jobs of their
    sweep ran at a time; runs from before that record say where they decoded the test set."""
    machines, jobs = set(), set()
    for run in (run for variant in group.variants for run in variant.runs):
        machines.add(describe_machine(run.results or {}, "these runs"))
        jobs.add(jobs_at_a_time(run.path.parent))
    parallel = "; ".join(f"{n} job(s) at a time" for n in sorted(jobs, key=str) if n is not None)
    return "; ".join(sorted(machines)) + (f"; {parallel}" if parallel else "")


def speed_axis(rows: list[dict[str, Any]]) -> tuple[str, str]:
    """The decode-speed column the BLEU-vs-speed figure plots: beam 5, or greedy where only greedy was
    timed (a length sweep's bounded measurement)."""
    if all(row["decode_sent_s_beam5"] is None for row in rows) and any(
        row["decode_sent_s_greedy"] is not None for row in rows
    ):
        return "decode_sent_s_greedy", "decode sentences/s, greedy"
    return "decode_sent_s_beam5", "decode sentences/s, beam 5"


def group_section(
    number: int,
    group: Group,
    out_dir: Path,
    *,
    baseline: str | None,
    decode: DecodeSettings,
    remeasure: bool,
) -> tuple[list[dict[str, Any]], list[Block], dict[str, bytes]]:
    """One group's rows, its part of the report and its figures (by file name, ``group<number>_*.png``)."""
    base = pick_baseline(group.variants, baseline)
    k = group_length(group)
    pairs = test_pairs(group.variants[0].runs[0]) if group.variants else None  # data is held equal
    sources, references = joined(pairs, k) if pairs else (None, None)
    settings = replace(decode, max_len=output_cap(group))
    speeds = decode_speeds(
        group, pairs[0] if pairs else None, k, out_dir / DECODE_CACHE, settings=settings, remeasure=remeasure
    )
    rows = [variant_row(v, base, references, speeds) for v in group.variants]
    pngs = {
        f"group{number}_curves.png": figures.seed_bands_png(group),
        f"group{number}_bleu_vs_speed.png": figures.tradeoff_png(rows, *speed_axis(rows)),
        f"group{number}_bleu_vs_memory.png": figures.tradeoff_png(
            rows, "kv_bytes_per_token", "KV-cache bytes per token"
        ),
    }
    skipped = attention_skipped(k, sources[ATTENTION_SENTENCE]) if sources else None
    attention = (
        None if skipped else group_attention(group, sources, out_dir / ATTENTION_CACHE, remeasure=remeasure)
    )
    if attention is not None:  # every variant's map of the fixed sentence side by side
        sentence, panels = attention
        title = f"test sentence {ATTENTION_SENTENCE + 1}: {sentence} (last decoder layer, mean over heads)"
        pngs[f"group{number}_attention.png"] = figures.png_bytes(comparison_figure(panels, title=title))
    blocks: list[Block] = [
        Heading(f"Group {number}", level=2),
        Bullets(header_lines(group, base, speeds, skipped)),
        # the headline is for quoting into Markdown pages; the HTML page has the full table only
        MarkdownOnly(headline_table(rows)),
        MarkdownOnly(Paragraph("All columns:")),
        full_table(rows),
        Images(pngs),
    ]
    return rows, blocks, pngs


def write_report(
    sweep_dirs: list[Path],
    out_dir: Path | None = None,
    *,
    baseline: str | None = None,
    decode_limit: int | None = None,
    beams: tuple[int, ...] | None = None,
    rounds: int | None = None,
    remeasure: bool = False,
) -> list[Path]:
    """report.md, report.html, report.csv, report.json and the figures for ``sweep_dirs`` (into ``out_dir``,
    default the first sweep dir). Decoding is timed on the first ``decode_limit`` test sentence pairs
    with ``beams`` in ``rounds`` rounds; each not given is the first sweep's report setting
    (:func:`~app.reports.decode_speed.sweep_settings`). Raises ValueError for a sweep without a finished
    job."""
    out_dir = out_dir or sweep_dirs[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    decode = sweep_settings(sweep_dirs[0], limit=decode_limit, beams=beams, rounds=rounds)
    groups, warnings = group_runs([run for sweep in sweep_dirs for run in sweep_runs(sweep)])
    for warning in warnings:
        log.warning(warning)
    blocks: list[Block] = [Heading(TITLE), Warnings(warnings)]
    all_rows: list[dict[str, Any]] = []
    rows_by_group: list[list[dict[str, Any]]] = []
    figure_paths: list[Path] = []
    for number, group in enumerate(groups, start=1):
        rows, section, pngs = group_section(
            number, group, out_dir, baseline=baseline, decode=decode, remeasure=remeasure
        )
        rows_by_group.append(rows)
        all_rows += [{"group": number, **row} for row in rows]
        blocks += section
        for name, data in pngs.items():
            (out_dir / name).write_bytes(data)
            figure_paths.append(out_dir / name)
    for number, across in enumerate(length_sections(groups, rows_by_group, baseline), start=1):
        name = LENGTHS_PNG if number == 1 else LENGTHS_PNG.replace(".png", f"_arm{number}.png")
        (out_dir / name).write_bytes(figures.lengths_png(across.found, LENGTH_METRICS))
        figure_paths.append(out_dir / name)
        blocks += [*across.blocks, Images({name: (out_dir / name).read_bytes()})]
    blocks += uptrain_sections(groups, rows_by_group)  # experiment=ablation_uptrain: converted vs scratch
    paths = [out_dir / name for name in REPORT_FILES]
    paths[0].write_text(render_markdown(blocks), encoding="utf-8")
    paths[1].write_text(render_html(TITLE, blocks), encoding="utf-8")
    with paths[2].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["group", *COLUMNS])
        writer.writeheader()
        writer.writerows(all_rows)
    incomplete = [{"path": str(r.path), "status": r.status} for g in groups for r in g.incomplete]
    report = {"warnings": warnings, "rows": all_rows, "incomplete": incomplete}
    paths[3].write_text(json.dumps(report, indent=1) + "\n")
    return [*paths, *figure_paths]
