"""The ablation across input lengths: the same variants trained at several ``data.concat`` lengths.

A sweep over ``data.concat=K`` gives one group per length (:data:`~app.reports.variants.HELD_EQUAL`
keeps lengths apart: their BLEU is not comparable). When every other held setting is equal, this
module lines the groups up by length: per variant, test BLEU, training tokens/s, peak memory and
greedy decoding speed at each length, and, per variant, the first length at which it overtakes the
baseline in speed and in memory on the machine that ran it, with what it costs in BLEU there (the
group's own paired tests against its baseline). A job that failed (out of memory, say) is shown as
failed at its length, never dropped.

Runs that started differently (trained from scratch, or fine-tuned from the data.concat=1 checkpoints
of a scratch sweep: experiment=ablation_length_finetune) are separate groups (their held "start"
differs), and each such arm is lined up on its own: a fine-tuned group is never the scratch group of
its length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.reports.render import Block, Bullets, Heading, Paragraph, Table
from app.reports.variants import START, Group, attention_name, describe_start, pick_baseline

LENGTH_KEY = "data.concat"
METRICS = {  # report-row column -> (what the length table calls it, higher is better)
    "bleu": ("BLEU", True),
    "step_tokens_per_s": ("train tokens/s (training steps, validation left out)", True),
    "peak_mb": ("peak MB", False),
    "decode_sent_s_greedy": ("decode sent/s (sentences, not examples)", True),
}


@dataclass(frozen=True)
class LengthPoint:
    """One variant at one length: its report row, or how its jobs ended when none finished."""

    length: int
    row: dict[str, Any] | None
    status: str = "finished"


def group_length(group: Group) -> int:
    """Sentence pairs per example of a group's runs (``data.concat``; 1 when the config has none)."""
    return int(group.held.get("input length", {}).get(LENGTH_KEY) or 1)


def arms(groups: list[Group]) -> list[list[int]]:
    """Indices of the groups that line up by length, one list per arm, each ordered by length: groups
    whose held settings other than the length are all equal (data, model size, budget, and the start:
    a fine-tune arm never lines up with the scratch groups of the same lengths). Arms of one group only
    are left out (nothing to line up)."""
    by_arm: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        others = {k: v for k, v in group.held.items() if k != "input length"}
        by_arm.setdefault(json.dumps(others, sort_keys=True, default=str), []).append(index)
    ordered = (sorted(members, key=lambda i: group_length(groups[i])) for members in by_arm.values())
    return [members for members in ordered if len(members) > 1]


def points(
    groups: list[Group], rows: list[list[dict[str, Any]]], order: list[int]
) -> dict[str, list[LengthPoint]]:
    """Every variant's points, by length (report rows of each group; failed jobs as failed points)."""
    found: dict[str, list[LengthPoint]] = {}
    for index in order:
        group, length = groups[index], group_length(groups[index])
        for row in rows[index]:
            row = {**row, "peak_mb": row.get("peak_gpu_mb") or row.get("peak_rss_mb")}
            found.setdefault(row["variant"], []).append(LengthPoint(length, row))
        finished = {row["variant"] for row in rows[index]}
        for run in group.incomplete:
            name = attention_name(run.config.get("attention", {}))
            if name not in finished:
                found.setdefault(name, []).append(LengthPoint(length, None, run.status))
                finished.add(name)
    return found


def crossover(
    mine: list[LengthPoint], base: list[LengthPoint], key: str, higher: bool
) -> tuple[LengthPoint, dict[str, Any]] | None:
    """The first length at which ``mine`` beats ``base`` on ``key`` (both finished there), with the
    baseline's row at that length."""
    base_at = {p.length: p.row for p in base if p.row is not None}
    for point in mine:
        other = base_at.get(point.length)
        if point.row is None or other is None or point.row.get(key) is None or other.get(key) is None:
            continue
        if (point.row[key] > other[key]) if higher else (point.row[key] < other[key]):
            return point, other
    return None


def cost_at(found: tuple[LengthPoint, dict[str, Any]] | None) -> str:
    """``K=64: -1.20 BLEU (p 0.03 *, seeds p 0.2)``, or ``never`` where the variant does not overtake.

    The difference is the paired test's where the group has one (two seeds or more), else the
    difference of the mean BLEU, said to be untested."""
    if found is None:
        return "never (at the lengths swept)"
    point, base = found
    row = point.row or {}
    if row.get("delta_bleu") is not None:
        star = " *" if row.get("significant") else ""
        seeds = f", seeds p {row['p_value_seeds']}" if row.get("p_value_seeds") is not None else ""
        return f"K={point.length}: {row['delta_bleu']:+.2f} BLEU (p {row['p_value']}{star}{seeds})"
    if row.get("bleu") is None or base.get("bleu") is None:
        return f"K={point.length}"
    return f"K={point.length}: {row['bleu'] - base['bleu']:+.2f} BLEU (mean difference, untested: one seed)"


def metric_table(found: dict[str, list[LengthPoint]], lengths: list[int], key: str, label: str) -> Table:
    """One row per variant, one column per length: the metric, or the job's status where none finished."""
    lines = []
    for name, series in found.items():
        by_length = {p.length: p for p in series}
        cells = []
        for length in lengths:
            point = by_length.get(length)
            value = None if point is None or point.row is None else point.row.get(key)
            cells.append(
                point.status
                if point is not None and point.row is None
                else "-"
                if value is None
                else f"{value:,}"
            )
        lines.append([name, *cells])
    return Table((label, *(f"K={k}" for k in lengths)), lines)


def crossover_lines(found: dict[str, list[LengthPoint]], baseline: str) -> list[str]:
    """Per variant: where it overtakes the baseline in training speed and in memory, and its BLEU there."""
    base = found.get(baseline, [])
    lines = []
    for name, series in found.items():
        if name == baseline:
            continue
        speed = crossover(series, base, "step_tokens_per_s", higher=True)
        memory = crossover(series, base, "peak_mb", higher=False)
        lines.append(f"{name}: faster to train from {cost_at(speed)}; leaner from {cost_at(memory)}")
    return lines


@dataclass
class LengthSection:
    """One arm's part of the report lined up by length, and its points (for the figure)."""

    blocks: list[Block]
    found: dict[str, list[LengthPoint]]


def length_sections(
    groups: list[Group], rows: list[list[dict[str, Any]]], baseline: str | None
) -> list[LengthSection]:
    """The report's "across input lengths" parts: one per arm (:func:`arms`); none when no groups line
    up. The baseline is ``baseline`` or each arm's default (:func:`~app.reports.variants.pick_baseline`)."""
    found_arms = arms(groups)
    sections = []
    for order in found_arms:
        base = pick_baseline(groups[min(order)].variants, baseline)
        if base is None:
            continue
        title = "Across input lengths"
        if len(found_arms) > 1:
            numbers = ", ".join(str(i + 1) for i in order)
            title += f": {describe_start(groups[order[0]].held.get(START, {}))} (groups {numbers})"
        sections.append(arm_section(groups, rows, order, base.name, title))
    return sections


def arm_section(
    groups: list[Group], rows: list[list[dict[str, Any]]], order: list[int], baseline: str, title: str
) -> LengthSection:
    """The groups ``order`` (one arm, by length) lined up: where each variant overtakes the baseline, and
    one table per metric."""
    lengths = [group_length(groups[i]) for i in order]
    found = points(groups, rows, order)
    start = groups[order[0]].held.get(START, {})
    scope = (
        f" Start: {describe_start(start)}; these groups are compared among themselves only, never with "
        "the scratch groups of the same lengths."
        if start
        else ""
    )
    blocks: list[Block] = [
        Heading(title, level=2),
        Paragraph(
            f"Groups {', '.join(str(i + 1) for i in order)} differ only in `{LENGTH_KEY}` (sentence pairs "
            f"per example: {', '.join(map(str, lengths))}); every other held setting is equal. Baseline: "
            f"{baseline}. A cell names a job's status where no seed finished.{scope}"
        ),
        Bullets(crossover_lines(found, baseline)),
    ]
    blocks += [metric_table(found, lengths, key, label) for key, (label, _) in METRICS.items()]
    return LengthSection(blocks, found)
