"""One multilingual model against bilingual models, direction by direction, with significance (issue 32).

The multilingual run's ``test.hyp`` holds every direction's test translations, in the order of its
``data.directions``; it is split back by the line counts of each direction's test references (as its
config names them: ``data.lang_files.test`` or ``data.pairs``). Each bilingual run serves one direction
(``data.src_lang`` -> ``data.tgt_lang``). ``--zero-shot de-fr=FILE`` adds the multilingual model's
translations of a direction it was not trained on. Scores are computed from the translations and the
references (and checked against each run's results.json): lowercased BLEU when the runs chose on it
(``selection.metric=bleu_lc``), else cased BLEU, and chrF. Each direction both sides serve gets
sacreBLEU's paired bootstrap (:func:`app.reports.significance.paired_bootstrap`). The report
itself (Markdown, HTML, JSON) and the command line: :mod:`app.reports.multilingual_report`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.data.corpus import read_lines
from app.data.multilingual import configured_directions, parse_direction
from app.data.multilingual_corpus import direction_files
from app.inference.metrics import corpus_scores
from app.reports.runs import RunRecord, describe_machine, read_run, read_text
from app.reports.significance import SAMPLES, SEED, SIGNIFICANCE, paired_bootstrap

RECORDED_TOLERANCE = 0.011  # results.json keeps scores rounded to 2 decimals


@dataclass(frozen=True)
class Outputs:
    """One system's test translations of one direction, and the references they are scored against."""

    hypotheses: list[str]
    references: list[str]
    reference_file: Path


def reference_files(run: RunRecord) -> dict[str, Path]:
    """Each direction's test reference file, as the run's config names it, in the run's order."""
    data = run.config.get("data") or {}
    if int(data.get("concat") or 1) > 1:
        raise ValueError(f"{run.path}: data.concat={data['concat']} scored joined examples, not sentences")
    directions = configured_directions(data)
    if directions is not None:
        return {d: Path(direction_files(data, d)["test"]["tgt"]) for d in directions}
    src, tgt = data.get("src_lang"), data.get("tgt_lang")
    reference = ((data.get("files") or {}).get("test") or {}).get("tgt")
    if not (src and tgt and reference):
        raise ValueError(f"{run.path}: its config names no test reference file (data.files.test.tgt)")
    return {f"{src}-{tgt}": Path(reference)}


def reference_lines(path: Path, cache: dict[Path, list[str]]) -> list[str]:
    """A reference file's lines, read as the run read them (plain or gzipped), once per report."""
    if path not in cache:
        if not path.is_file():
            raise ValueError(f"test reference file {path} not found (as a run's config names it, from here)")
        cache[path] = read_lines(path)
    return cache[path]


def hypothesis_file(run: RunRecord) -> tuple[Path, list[str]]:
    """The file the run's test translations are read from (test.hyp, test.hyp.gz or a compact record's
    hypotheses.jsonl.gz) and their lines."""
    lines = run.hypotheses
    if lines is None:
        raise ValueError(f"{run.path}: no {run.files.hypotheses.name} (status: {run.status})")
    return run.hypotheses_file, lines


def split_by_direction(
    hyp_file: Path, hypotheses: list[str], references: Mapping[str, tuple[Path, list[str]]]
) -> dict[str, Outputs]:
    """A multilingual test.hyp cut into its directions by the references' line counts, in order."""
    counts = {d: len(lines) for d, (_, lines) in references.items()}
    if sum(counts.values()) != len(hypotheses):
        parts = ", ".join(f"{path} ({d}): {counts[d]}" for d, (path, _) in references.items())
        raise ValueError(
            f"{hyp_file} has {len(hypotheses)} lines, but the test references of its directions have "
            f"{sum(counts.values())} ({parts})"
        )
    outputs, start = {}, 0
    for direction, (path, lines) in references.items():
        outputs[direction] = Outputs(hypotheses[start : start + len(lines)], lines, path)
        start += len(lines)
    return outputs


def aligned(name: str, hyp_file: Path, hypotheses: list[str], ref_file: Path, refs: list[str]) -> Outputs:
    """``hypotheses`` of one direction, refused unless they are as many as its references."""
    if len(hypotheses) != len(refs):
        raise ValueError(
            f"{name}: {hyp_file} has {len(hypotheses)} lines, its test references {ref_file} have {len(refs)}"
        )
    return Outputs(hypotheses, refs, ref_file)


def costs(results: Mapping[str, Any]) -> dict[str, Any]:
    """What a run spent, from its results.json: parameters, optimizer steps, training tokens (recorded as
    a rate: tokens/s x seconds), minutes of training."""
    seconds, rate = results.get("fit_seconds"), results.get("train_tokens_per_s")
    tokens = results.get("train_tokens", rate * seconds if rate is not None and seconds else None)
    return {
        "parameters": results.get("parameters"),
        "steps": results.get("global_step"),
        "train_tokens": None if tokens is None else round(tokens),
        "train_minutes": None if seconds is None else round(seconds / 60, 2),
    }


def scores(outputs: Outputs) -> dict[str, float]:
    found = corpus_scores(outputs.hypotheses, outputs.references)
    return {"bleu": found.bleu, "bleu_lc": found.bleu_lc, "chrf": found.chrf}


def recorded_mismatches(run: RunRecord, direction: str, found: Mapping[str, float]) -> list[str]:
    """Where a score computed here differs from the run's results.json (``test_bleu/de-en``, or the
    bilingual ``test_bleu``)."""
    results, per_direction = run.results or {}, "test_directions" in (run.results or {})
    problems = []
    for metric, value in found.items():
        key = f"test_{metric}/{direction}" if per_direction else f"test_{metric}"
        if key in results and abs(results[key] - value) > RECORDED_TOLERANCE:
            problems.append(f"{run.path}: {key} is {results[key]} in results.json, {value:.2f} recomputed")
    return problems


def headline_metric(runs: Sequence[RunRecord], asked: str | None) -> tuple[str, list[str]]:
    """``bleu_lc`` when every run chose on it (``selection.metric``), else ``bleu``; or what was asked."""
    chosen = {run.path: (run.config.get("selection") or {}).get("metric") or "bleu" for run in runs}
    if asked:
        return asked, []
    metric = "bleu_lc" if set(chosen.values()) == {"bleu_lc"} else "bleu"
    if len(set(chosen.values())) > 1:
        named = ", ".join(f"{path}: {m}" for path, m in chosen.items())
        return metric, [f"the runs chose on different metrics ({named}); the headline is cased BLEU"]
    return metric, []


def compare(ml: Outputs, bi: Outputs | None, metric: str, samples: int) -> dict[str, Any]:
    """One direction's numbers: both sides' scores and, where both exist, the paired bootstrap."""
    row: dict[str, Any] = {"sentences": len(ml.references), "reference": str(ml.reference_file)}
    row["multilingual"], row["bilingual"] = scores(ml), (scores(bi) if bi else None)
    row |= dict.fromkeys(("delta", "ci95", "p_value", "significant"))
    if bi is not None:
        if bi.references != ml.references:
            raise ValueError(f"the test references differ: {ml.reference_file} and {bi.reference_file}")
        test = paired_bootstrap(
            bi.hypotheses, ml.hypotheses, ml.references, samples=samples, lowercase=metric == "bleu_lc"
        )
        row |= {"delta": test["delta"], "ci95": test["ci"], "p_value": test["p_value"]}
        row["significant"] = test["p_value"] < SIGNIFICANCE
    return row


def parse_zero_shot(values: Sequence[str]) -> dict[str, Path]:
    """``["de-fr=FILE", ...]`` as ``{"de-fr": FILE}``."""
    found = {}
    for value in values:
        direction, sep, path = value.partition("=")
        if not sep or not path:
            raise ValueError(f"--zero-shot {value!r}: give DIRECTION=FILE, e.g. de-fr=runs/ml/zs.de-fr")
        parse_direction(direction)
        found[direction] = Path(path)
    return found


def bilingual_outputs(
    paths: Sequence[Path], cache: dict[Path, list[str]]
) -> tuple[dict[str, RunRecord], dict[str, Outputs]]:
    """Each bilingual run and its outputs, by direction (one run per direction)."""
    runs: dict[str, RunRecord] = {}
    outputs: dict[str, Outputs] = {}
    for path in paths:
        run = read_run(path)
        references = reference_files(run)
        if len(references) != 1:
            raise ValueError(f"{run.path}: a bilingual run has one direction, it has {list(references)}")
        ((direction, ref_file),) = references.items()
        if direction in runs:
            raise ValueError(f"two bilingual runs of {direction}: {runs[direction].path} and {run.path}")
        runs[direction] = run
        refs = reference_lines(ref_file, cache)
        outputs[direction] = aligned(str(run.path), *hypothesis_file(run), ref_file, refs)
    return runs, outputs


def zero_shot_outputs(
    ml_run: RunRecord,
    files: Mapping[str, Path],
    bilingual: Mapping[str, Outputs],
    cache: dict[Path, list[str]],
) -> dict[str, Outputs]:
    """The ``--zero-shot`` translations, scored against the bilingual run's references of that direction
    (else the multilingual run's ``data.lang_files`` pattern filled in)."""
    outputs = {}
    for direction, hyp_file in files.items():
        name = f"--zero-shot {direction}"
        if direction in bilingual:
            ref_file = bilingual[direction].reference_file
        else:
            try:
                ref_file = Path(direction_files(ml_run.config.get("data") or {}, direction)["test"]["tgt"])
            except ValueError as error:
                raise ValueError(f"{name}: {error}; give a bilingual run of {direction}") from error
        if not hyp_file.is_file():
            raise ValueError(f"{name}: {hyp_file} not found")
        hyps = read_text(hyp_file).splitlines()
        outputs[direction] = aligned(name, hyp_file, hyps, ref_file, reference_lines(ref_file, cache))
    return outputs


def build_report(
    multilingual: Path,
    bilingual: Sequence[Path],
    zero_shot: Mapping[str, Path] | None = None,
    *,
    metric: str | None = None,
    samples: int = SAMPLES,
) -> dict[str, Any]:
    """The report's numbers (what report.json holds). Raises ValueError naming the file at fault."""
    ml_run, cache = read_run(multilingual), {}
    ml_refs = {d: (p, reference_lines(p, cache)) for d, p in reference_files(ml_run).items()}
    recorded = (ml_run.results or {}).get("test_directions")
    if recorded is not None and list(recorded) != list(ml_refs):
        raise ValueError(
            f"{ml_run.path}: results.json's test_directions {recorded} differ from "
            f"data.directions {list(ml_refs)}, the order of test.hyp"
        )
    ml_outputs = split_by_direction(*hypothesis_file(ml_run), ml_refs)
    bi_runs, bi_outputs = bilingual_outputs(bilingual, cache)
    trained_on = set(ml_outputs)
    trained_twice = sorted(set(zero_shot or {}) & trained_on)
    if trained_twice:
        raise ValueError(
            f"--zero-shot {', '.join(trained_twice)}: {ml_run.path} was trained on it (see test.hyp)"
        )
    ml_outputs |= zero_shot_outputs(ml_run, zero_shot or {}, bi_outputs, cache)
    unserved = sorted(set(bi_outputs) - set(ml_outputs))
    if unserved:
        raise ValueError(
            f"bilingual run(s) of {', '.join(unserved)}, which {ml_run.path} was not trained "
            "on: give its translations with --zero-shot DIRECTION=FILE"
        )

    metric, warnings = headline_metric([ml_run, *bi_runs.values()], metric)
    rows = []
    for direction, outputs in ml_outputs.items():
        bi_run = bi_runs.get(direction)
        row = {"direction": direction, "zero_shot": direction not in trained_on}
        row |= compare(outputs, bi_outputs.get(direction), metric, samples)
        row["bilingual_run"] = None if bi_run is None else str(bi_run.path)
        if not row["zero_shot"]:
            warnings += recorded_mismatches(ml_run, direction, row["multilingual"])
        if bi_run is not None:
            warnings += recorded_mismatches(bi_run, direction, row["bilingual"])
        rows.append(row)
    shared_costs = [
        costs(bi_runs[r["direction"]].results or {})
        for r in rows
        if r["bilingual_run"] and not r["zero_shot"]
    ]
    return {
        "metric": metric,
        "samples": samples,
        "seed": SEED,
        "multilingual": run_entry(ml_run, list(ml_refs)),
        "bilingual": [run_entry(run, [d]) for d, run in bi_runs.items()],
        "zero_shot": {d: str(p) for d, p in (zero_shot or {}).items()},
        "rows": rows,
        "mean": mean_row(rows, shared_costs, metric),
        "warnings": warnings,
    }


def run_entry(run: RunRecord, directions: list[str]) -> dict[str, Any]:
    results = run.results or {}
    return {
        "path": str(run.path),
        "directions": directions,
        "status": run.status,
        "machine": describe_machine(results),
        **costs(results),
    }


def mean_row(
    rows: list[dict[str, Any]], bilingual_costs: list[dict[str, Any]], metric: str
) -> dict[str, Any] | None:
    """The unweighted mean over the trained directions both sides serve, and the bilingual costs summed."""
    both = [r for r in rows if r["bilingual"] is not None and not r["zero_shot"]]
    if not both:
        return None
    means = {
        side: {m: statistics.fmean(r[side][m] for r in both) for m in ("bleu", "bleu_lc", "chrf")}
        for side in ("multilingual", "bilingual")
    }
    totals = {
        key: None if any(c[key] is None for c in bilingual_costs) else sum(c[key] for c in bilingual_costs)
        for key in ("parameters", "steps", "train_tokens", "train_minutes")
    }
    delta = means["multilingual"][metric] - means["bilingual"][metric]
    return {
        "directions": [r["direction"] for r in both],
        **means,
        "delta": delta,
        "bilingual_costs_summed": totals,
    }
