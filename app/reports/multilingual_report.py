"""The multilingual report's files and command line: report.md, report.html and report.json.

    python scripts/report_multilingual.py --multilingual runs/ml6 --bilingual runs/bi_en-de runs/bi_de-en \\
        --zero-shot de-fr=runs/ml6/zs.de-fr --out docs/results/ml6_vs_bilingual

One row per direction: the multilingual and the bilingual score, their difference with sacreBLEU's paired
bootstrap (95% CI, p-value), chrF, and what each side cost (parameters, steps, training tokens, minutes);
then the mean over the directions both sides serve. The numbers come from
:func:`app.reports.multilingual.build_report`; docs/data.md shows the command in use.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.io import atomic_write
from app.reports.multilingual import build_report, parse_zero_shot
from app.reports.render import Block, Bullets, Heading, Table, Warnings
from app.reports.render import html as render_html
from app.reports.render import markdown as render_markdown
from app.reports.significance import SIGNIFICANCE

TITLE = "Multilingual against bilingual models"
COMMAND = "python scripts/report_multilingual.py"
REPORT_FILES = ("report.md", "report.html", "report.json")
METRIC_NAMES = {"bleu": "BLEU", "bleu_lc": "BLEU lc"}


def number(value: float | None, spec: str, prefix: str = "") -> str:
    return "" if value is None else prefix + format(value, spec)


def cost_cells(ml: Mapping[str, Any], bi: Mapping[str, Any] | None) -> list[str]:
    """``multilingual / bilingual`` cells: parameters, steps, training tokens, minutes."""
    cells = []
    for key, show in (
        ("parameters", lambda v: f"{v / 1e6:.2f}M"),
        ("steps", lambda v: f"{v:,}"),
        ("train_tokens", lambda v: f"{v / 1e6:.1f}M"),
        ("train_minutes", lambda v: f"{v:.1f}"),
    ):
        sides = [ml.get(key), None if bi is None else bi.get(key)]
        cells.append(" / ".join("-" if v is None else show(v) for v in sides[: 1 if bi is None else 2]))
    return cells


def report_table(report: Mapping[str, Any]) -> Table:
    """One row per direction (zero-shot ones marked), then the mean over the shared directions."""
    metric, name = report["metric"], METRIC_NAMES[report["metric"]]
    header = (
        "direction", f"multilingual {name}", f"bilingual {name}", "delta", "95% CI", "p", "significant",
        "chrF multilingual / bilingual", "params multi / bi", "steps multi / bi",
        "train tokens multi / bi", "train min multi / bi",
    )  # fmt: skip
    ml_costs = report["multilingual"]
    bi_costs = {entry["path"]: entry for entry in report["bilingual"]}
    rows = []
    for row in report["rows"]:
        bi = row["bilingual"]
        significant = "" if row["significant"] is None else ("yes" if row["significant"] else "no")
        chrf = f"{row['multilingual']['chrf']:.1f}" + ("" if bi is None else f" / {bi['chrf']:.1f}")
        rows.append([
            f"{row['direction']} (zero-shot)" if row["zero_shot"] else row["direction"],
            f"{row['multilingual'][metric]:.2f}", "" if bi is None else f"{bi[metric]:.2f}",
            number(row["delta"], "+.2f"), number(row["ci95"], ".2f", "± "), number(row["p_value"], ".4f"),
            significant, chrf, *cost_cells(ml_costs, bi_costs.get(row["bilingual_run"] or "")),
        ])  # fmt: skip
    mean = report["mean"]
    if mean is not None:
        ml, bi, count = mean["multilingual"], mean["bilingual"], len(mean["directions"])
        rows.append([
            f"mean ({count} direction{'s' * (count > 1)})", f"{ml[metric]:.2f}", f"{bi[metric]:.2f}",
            f"{mean['delta']:+.2f}", "", "", "", f"{ml['chrf']:.1f} / {bi['chrf']:.1f}",
            *cost_cells(ml_costs, mean["bilingual_costs_summed"]),
        ])  # fmt: skip
    return Table(header, rows)


def header_lines(report: Mapping[str, Any]) -> list[str]:
    """What the table is: the command, the metric, the test, the runs and the machines they trained on."""
    ml = report["multilingual"]
    lowercased = report["metric"] == "bleu_lc"
    metric = "BLEU on lowercased text (sacreBLEU `lowercase=True`" if lowercased else "cased BLEU (sacreBLEU"
    lines = [
        f"made by: `{report['command']}`",
        f"headline: {metric}, 13a tokens); chrF beside it; both computed from test.hyp and the references",
        f"test: sacreBLEU's paired bootstrap ({report['samples']} resamples, seed {report['seed']}) of the "
        "multilingual outputs against the bilingual ones on the same sentences; delta = multilingual - "
        "bilingual; 95% CI = half-width of the multilingual score's 95% interval over the resamples; "
        f"significant: p < {SIGNIFICANCE}",
        f"multilingual: {ml['path']} ({', '.join(ml['directions'])}), trained on {ml['machine']}",
    ]
    lines += [
        f"bilingual {b['directions'][0]}: {b['path']}, trained on {b['machine']}" for b in report["bilingual"]
    ]
    lines += [
        f"zero-shot {direction}: {path} (a direction the multilingual model was not trained on)"
        for direction, path in report["zero_shot"].items()
    ]
    lines.append("train tokens: source + target subwords, results.json's train_tokens_per_s x fit_seconds")
    if report["mean"] is not None:
        lines.append(
            "mean: the unweighted mean over the directions both sides serve (no zero-shot row); "
            "its costs: the multilingual model / the sum of those bilingual models"
        )
    return lines


def report_blocks(report: Mapping[str, Any]) -> list[Block]:
    return [Heading(TITLE), Bullets(header_lines(report)), Warnings(report["warnings"]), report_table(report)]


def write_report(report: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """report.md, report.html and report.json in ``out_dir``, each written atomically."""
    blocks = report_blocks(report)
    texts = (render_markdown(blocks), render_html(TITLE, blocks), json.dumps(report, indent=1) + "\n")
    paths = [out_dir / name for name in REPORT_FILES]
    for path, text in zip(paths, texts, strict=True):
        with atomic_write(path, "w", encoding="utf-8") as out:
            out.write(text)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (scripts/report_multilingual.py); 2 with a one-line error on bad input."""
    args_given = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=COMMAND.split()[-1], description=TITLE)
    parser.add_argument(
        "--multilingual", type=Path, required=True, metavar="RUN_DIR", help="the multilingual run directory"
    )
    parser.add_argument(
        "--bilingual", type=Path, nargs="+", required=True, metavar="RUN_DIR", help="one run per direction"
    )
    parser.add_argument(
        "--zero-shot",
        action="extend",
        nargs="+",
        default=[],
        metavar="DIR=FILE",
        help="the multilingual model's translations of a direction it was not trained on, e.g. de-fr=FILE",
    )
    parser.add_argument(
        "--metric",
        choices=sorted(METRIC_NAMES),
        help="the headline (default: bleu_lc when every run chose on it, else bleu)",
    )
    parser.add_argument("--out", type=Path, help="write report.md, .html, .json here (default: print)")
    args = parser.parse_args(args_given)
    try:
        report = build_report(
            args.multilingual, args.bilingual, parse_zero_shot(args.zero_shot), metric=args.metric
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    report = {"command": f"{COMMAND} {shlex.join(args_given)}", **report}
    if args.out is None:
        print(render_markdown(report_blocks(report)), end="")
    else:
        print("\n".join(f"wrote {path}" for path in write_report(report, args.out)))
    return 0
