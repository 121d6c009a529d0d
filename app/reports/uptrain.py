"""The uptraining ablation: attention converted on a trained model and uptrained, against the same attention
trained from scratch for the same total budget (experiment=ablation_uptrain, issue 50).

Its sweep has two arms that :data:`~app.reports.variants.HELD_EQUAL` keeps in separate groups (their start
and step budget differ): *converted* jobs start from one trained model (``init_from``), converted to the
job's attention (:mod:`app.attention.convert`), and train X steps; *scratch* jobs train the same attention
from random weights for B + X steps, B being the trained model's own steps. This module pairs the two
groups and lines them up variant by variant: converted minus scratch in BLEU, tested as the report tests
any variant against its baseline (sacreBLEU's paired bootstrap over the pooled seeds, and the bootstrap
over seeds and sentences; :mod:`app.reports.significance`), with the scratch job as the baseline. Within
each group the report's own table already compares every variant with the MHA one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.reports.lengths import group_length
from app.reports.render import Block, Bullets, Heading, Paragraph, Table
from app.reports.significance import baseline_comparison
from app.reports.variants import START, Group, joined, test_pairs
from app.rundir import RESULTS

BUDGET = "trainer.max_steps"
HEADER = (
    "variant", "steps converted / scratch", "BLEU converted", "BLEU scratch", "converted - scratch (95% CI)",
    "p sentences", "p seeds", "decode sent/s greedy",
)  # fmt: skip


def uptrain_pairs(groups: list[Group]) -> list[tuple[int, int]]:
    """(converted, scratch) group indices: a group started from a checkpoint (``init_from``) and one from
    scratch whose held settings other than the start and the budget are equal, the scratch one trained
    for more steps."""
    pairs = []
    for i, converted in enumerate(groups):
        if "init_from" not in converted.held.get(START, {}):
            continue
        for j, scratch in enumerate(groups):
            if scratch.held.get(START) or not same_but_start_and_budget(converted, scratch):
                continue
            if (steps(scratch) or 0) > (steps(converted) or 0):
                pairs.append((i, j))
    return pairs


def same_but_start_and_budget(a: Group, b: Group) -> bool:
    """Whether groups ``a`` and ``b`` hold the same data, model size and input length."""
    keys = set(a.held) | set(b.held)
    return all(a.held.get(k) == b.held.get(k) for k in keys if k not in (START, "budget"))


def steps(group: Group) -> int | None:
    """The group's step budget (``trainer.max_steps``; None where it has none)."""
    value = group.held.get("budget", {}).get(BUDGET)
    return int(value) if isinstance(value, int) and value > 0 else None


def base_results(checkpoint: str) -> dict[str, Any]:
    """The start model's own results.json (``<run>/checkpoints/x.ckpt``); empty where there is none."""
    try:
        found = json.loads((Path(checkpoint).parent.parent / RESULTS).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def base_steps(checkpoint: str) -> int | None:
    """The steps the start model trained for, from its run's results.json."""
    value = base_results(checkpoint).get("global_step")
    return value if isinstance(value, int) else None


def base_bleu(checkpoint: str) -> float | None:
    """The start model's own cased test BLEU, from its run's results.json."""
    value = base_results(checkpoint).get("test_bleu")
    return float(value) if isinstance(value, int | float) else None


def uptrain_sections(groups: list[Group], rows: list[list[dict[str, Any]]]) -> list[Block]:
    """The report's "converted against scratch" part, one per pair of groups (none without a pair)."""
    blocks: list[Block] = []
    for converted, scratch in uptrain_pairs(groups):
        blocks += pair_section(groups, rows, converted, scratch)
    return blocks


def pair_section(
    groups: list[Group], rows: list[list[dict[str, Any]]], converted: int, scratch: int
) -> list[Block]:
    """Every variant both groups finished: its converted and scratch BLEU, their paired tests, decoding."""
    ours, theirs = groups[converted], groups[scratch]
    pairs = test_pairs(ours.variants[0].runs[0]) if ours.variants else None
    references = joined(pairs, group_length(ours))[1] if pairs else None
    scratch_by_name = {variant.name: variant for variant in theirs.variants}
    rows_by_name = {row["variant"]: row for row in rows[converted]}
    start = ours.held[START]["init_from"]
    x, total, b, base = steps(ours), steps(theirs), base_steps(start), base_bleu(start)
    lines, verdicts = [], []
    for variant in ours.variants:
        other = scratch_by_name.get(variant.name)
        if other is None:
            continue
        test = baseline_comparison(other, variant, references)
        mine, its = rows_by_name.get(variant.name, {}), {r["variant"]: r for r in rows[scratch]}[other.name]
        lines.append([
            variant.name,
            f"{x} / {total}",
            mean_and_spread(mine),
            mean_and_spread(its),
            "" if test["delta_bleu"] is None else f"{test['delta_bleu']:+.2f} ± {test['ci95']:.2f}",
            starred(test["p_value"], test["significant"]),
            starred(test["p_value_seeds"], test["significant_seeds"]),
            f"{mine.get('decode_sent_s_greedy') or '-'}",
        ])  # fmt: skip
        verdicts.append(verdict(variant.name, mine, its, test, base))
    share = f" ({100 * x / b:.0f}% of the base's {b} steps)" if x and b else ""
    same = "the same total budget" if not (x and b) or b + x == total else f"NOT the base's {b} + {x} steps"
    scored = f" (test BLEU {base} as trained)" if base is not None else ""
    return [
        Heading("Converted and uptrained against trained from scratch", level=2),
        Paragraph(
            f"Group {converted + 1}: each job starts from {start}{scored}, its attention converted to the "
            f"job's (app/attention/convert.py), then trains {x} steps{share}. Group {scratch + 1}: the same "
            f"attention from random weights for {total} steps, {same}. Every converted job "
            "starts from the one base model, so its seeds vary the uptraining only. Difference: cased "
            "test BLEU, converted minus scratch, the report's paired bootstrap over the pooled seeds "
            "(* = p < 0.05) and its bootstrap over seeds and sentences."
        ),
        Bullets(verdicts),
        Table(HEADER, lines),
    ]


def mean_and_spread(row: dict[str, Any]) -> str:
    """A variant's mean BLEU and its standard deviation over seeds ("37.8 (1 seed)" without one)."""
    if row.get("bleu_std") is None:
        return f"{row.get('bleu')} (1 seed)"
    return f"{row.get('bleu')} ± {row['bleu_std']}"


def starred(p_value: float | None, significant: bool | None) -> str:
    """A p-value with `` *`` when significant; empty when there is none."""
    return "" if p_value is None else f"{p_value}{' *' if significant else ''}"


def verdict(
    name: str, mine: dict[str, Any], its: dict[str, Any], test: dict[str, Any], base: float | None = None
) -> str:
    """One line: whether converting paid for this variant, and its cost against the converted MHA job and
    against the base model as trained (``base``: its test BLEU)."""
    if test["delta_bleu"] is None:
        if mine.get("bleu") is None or its.get("bleu") is None:
            return f"{name}: no comparison (a job did not finish)"
        diff = mine["bleu"] - its["bleu"]
        said = f"{name}: converted {diff:+.2f} BLEU against scratch (mean difference, untested: one seed)"
    else:
        over_seeds = (
            f"over seeds p {starred(test['p_value_seeds'], test['significant_seeds'])}"
            if test["p_value_seeds"] is not None
            else "no test over seeds: one seed on a side"
        )
        said = (
            f"{name}: converted {test['delta_bleu']:+.2f} BLEU against scratch (p "
            f"{starred(test['p_value'], test['significant'])}; {over_seeds})"
        )
    if mine.get("delta_bleu") is not None:
        said += f"; {mine['delta_bleu']:+.2f} against the converted arm's MHA job"
    if base is not None and mine.get("bleu") is not None:
        said += f"; {mine['bleu'] - base:+.2f} against the base model ({base})"
    return said
