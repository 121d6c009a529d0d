"""scripts/report_multilingual.py: a multilingual run against bilingual runs, per direction.

The run directories are built as train.py leaves them: the composed config in ``.hydra/config.yaml``,
``results.json`` scored by the code a run scores with, and ``test.hyp`` (gzipped for the multilingual
run, as the committed records keep it). The translations are the committed test references with words
dropped at random, a different rate per system, so every score and difference is a real one.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from helpers.training import compose_train, read_gz_lines, tiny_overrides
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from app.inference.directions import direction_results
from app.inference.metrics import corpus_scores
from app.reports.multilingual import split_by_direction
from app.reports.multilingual_report import main
from app.reports.significance import SEED

DIRECTIONS = ["de-en", "en-de", "en-fr"]
TEST_LINES = 200  # tests/fixtures/multi30k's test_2016_flickr
MACHINE = {"device": "cpu", "torch": "2.13.0+cpu", "threads": 2, "cpu_model": "AMD EPYC", "cpu_flags": []}


def degraded(references: list[str], drop: float, seed: int) -> list[str]:
    """The references with each word dropped with probability ``drop``: a system of known quality."""
    rng = random.Random(seed)
    return [" ".join(w for w in line.split() if rng.random() >= drop) for line in references]


def costs(steps: int, minutes: float) -> dict[str, Any]:
    """The run statistics results.json carries besides the scores (app.training.task.run_statistics)."""
    return {
        "parameters": 7_578_624,
        "global_step": steps,
        "fit_seconds": minutes * 60,
        "train_tokens_per_s": 5000,
        "machine": MACHINE,
    }


def write_run(
    run: Path, config: Any, hypotheses: list[str], results: dict[str, Any], *, packed: bool
) -> Path:
    """A run directory as train.py writes it (test.hyp gzipped when ``packed``, as under docs/)."""
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(config, run / ".hydra" / "config.yaml")
    text = "".join(h + "\n" for h in hypotheses).encode("utf-8")
    if packed:
        (run / "test.hyp.gz").write_bytes(gzip.compress(text))
    else:
        (run / "test.hyp").write_bytes(text)
    (run / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return run


def references(multi30k_dir: Path, direction: str) -> list[str]:
    return read_gz_lines(multi30k_dir / f"test_2016_flickr.{direction.split('-')[1]}.gz", TEST_LINES)


@pytest.fixture(scope="module")
def runs(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One multilingual run (de-en, en-de, en-fr), bilingual de-en, en-fr and de-fr runs, and the
    multilingual model's zero-shot de-fr translations."""
    root = tmp_path_factory.mktemp("mlreport")

    def config(*extra: str) -> Any:
        overrides = tiny_overrides(multi30k_dir, root / "run", root / "cache", "data.suffix=.gz", *extra)
        return compose_train([*overrides, "selection.metric=bleu_lc"])

    refs = {d: references(multi30k_dir, d) for d in [*DIRECTIONS, "de-fr"]}
    ml_hyps = {d: degraded(refs[d], 0.15 + 0.05 * i, seed=i) for i, d in enumerate(DIRECTIONS)}
    concatenated = [h for d in DIRECTIONS for h in ml_hyps[d]]
    spans, start = [], 0
    for d in DIRECTIONS:
        spans.append((d, start, start + len(refs[d])))
        start += len(refs[d])
    all_refs = [r for d in DIRECTIONS for r in refs[d]]
    ml_results = {**direction_results(concatenated, all_refs, spans), **costs(3000, 180)}
    ml = write_run(
        root / "ml",
        config(f"data.directions=[{','.join(DIRECTIONS)}]"),
        concatenated,
        ml_results,
        packed=True,
    )

    bilingual, bi_hyps = {}, {}
    for seed, (direction, drop) in enumerate((("de-en", 0.3), ("en-fr", 0.15), ("de-fr", 0.2)), start=10):
        src, tgt = direction.split("-")
        bi_hyps[direction] = degraded(refs[direction], drop, seed)
        scored = corpus_scores(bi_hyps[direction], refs[direction], tgt).rounded(prefix="test_")
        bilingual[direction] = write_run(
            root / f"bi_{direction}",
            config(f"data.src_lang={src}", f"data.tgt_lang={tgt}"),
            bi_hyps[direction],
            {**scored, **costs(1000, 60)},
            packed=False,
        )
    zero_shot = root / "zs.de-fr"
    zs_hyps = degraded(refs["de-fr"], 0.6, seed=99)  # zero-shot: much worse
    zero_shot.write_text("".join(h + "\n" for h in zs_hyps), encoding="utf-8")
    ml_hyps["de-fr"] = zs_hyps
    return {
        "root": root,
        "ml": ml,
        "bilingual": bilingual,
        "zero_shot": zero_shot,
        "refs": refs,
        "ml_hyps": ml_hyps,
        "bi_hyps": bi_hyps,
    }


def report(runs: dict[str, Any], out: Path, *bilingual: str, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    args = ["--multilingual", str(runs["ml"]), "--bilingual", *[str(runs["bilingual"][d]) for d in bilingual]]
    assert main([*args, *extra, "--out", str(out)]) == 0
    return json.loads((out / "report.json").read_text())


def direct_bootstrap(baseline: list[str], system: list[str], refs: list[str]) -> tuple[float, float]:
    """sacreBLEU's paired bootstrap on lowercased BLEU, called directly: (delta, p-value)."""
    os.environ["SACREBLEU_SEED"] = str(SEED)
    try:
        test = PairedTest(
            [("b", baseline), ("s", system)],
            {"BLEU": BLEU(lowercase=True)},
            [refs],
            test_type="bs",
            n_samples=1000,
        )
        base, result = test()[1]["BLEU"]
    finally:
        os.environ.pop("SACREBLEU_SEED")
    return result.score - base.score, result.p_value


def test_rows_match_sacrebleu_and_each_runs_results(runs: dict[str, Any], tmp_path: Path) -> None:
    found = report(runs, tmp_path, "de-en", "en-fr", extra=("--zero-shot", f"de-fr={runs['zero_shot']}"))
    assert found["metric"] == "bleu_lc" and found["warnings"] == []  # recomputed == results.json
    rows = {row["direction"]: row for row in found["rows"]}
    assert list(rows) == [*DIRECTIONS, "de-fr"]
    ml_results = json.loads((runs["ml"] / "results.json").read_text())
    for direction in DIRECTIONS:  # the split of the multilingual test.hyp.gz, direction by direction
        hyps, refs = runs["ml_hyps"][direction], runs["refs"][direction]
        ml = rows[direction]["multilingual"]
        assert ml["bleu_lc"] == pytest.approx(BLEU(lowercase=True).corpus_score(hyps, [refs]).score)
        assert ml["chrf"] == pytest.approx(CHRF().corpus_score(hyps, [refs]).score)
        assert round(ml["bleu_lc"], 2) == ml_results[f"test_bleu_lc/{direction}"]
    for direction in ("de-en", "en-fr"):
        row, refs = rows[direction], runs["refs"][direction]
        bi_hyps = runs["bi_hyps"][direction]
        assert row["bilingual"]["bleu_lc"] == pytest.approx(
            BLEU(lowercase=True).corpus_score(bi_hyps, [refs]).score
        )
        delta, p_value = direct_bootstrap(bi_hyps, runs["ml_hyps"][direction], refs)
        assert row["delta"] == pytest.approx(delta) and row["p_value"] == pytest.approx(p_value)
        assert row["significant"] == (p_value < 0.05) and row["ci95"] > 0
    assert (
        rows["de-en"]["delta"] > 0 > rows["en-fr"]["delta"]
    )  # multilingual drops 0.15 and 0.25 of the words, bilingual 0.3 and 0.15
    assert rows["en-de"]["bilingual"] is None and rows["en-de"]["p_value"] is None
    mean = found["mean"]
    assert mean["directions"] == ["de-en", "en-fr"]  # both sides, zero-shot left out
    expected = (rows["de-en"]["multilingual"]["bleu_lc"] + rows["en-fr"]["multilingual"]["bleu_lc"]) / 2
    assert mean["multilingual"]["bleu_lc"] == pytest.approx(expected)
    assert mean["bilingual_costs_summed"] == {
        "parameters": 2 * 7_578_624,
        "steps": 2000,
        "train_tokens": 2 * 60 * 60 * 5000,
        "train_minutes": 120,
    }

    markdown = (tmp_path / "report.md").read_text()
    de_en = rows["de-en"]
    line = next(line for line in markdown.splitlines() if line.startswith("| de-en |"))
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[1:8] == [
        f"{de_en['multilingual']['bleu_lc']:.2f}",
        f"{de_en['bilingual']['bleu_lc']:.2f}",
        f"{de_en['delta']:+.2f}",
        f"± {de_en['ci95']:.2f}",
        f"{de_en['p_value']:.4f}",
        "yes" if de_en["significant"] else "no",
        f"{de_en['multilingual']['chrf']:.1f} / {de_en['bilingual']['chrf']:.1f}",
    ]
    assert cells[8:] == ["7.58M / 7.58M", "3,000 / 1,000", "54.0M / 18.0M", "180.0 / 60.0"]
    assert "| multilingual BLEU lc | bilingual BLEU lc |" in markdown
    assert "| mean (2 directions) |" in markdown and "| 7.58M / 15.16M | 3,000 / 2,000 |" in markdown
    command = f"python scripts/report_multilingual.py --multilingual {runs['ml']} --bilingual"
    assert f"made by: `{command}" in markdown and "AMD EPYC (2 threads), torch 2.13.0+cpu" in markdown
    assert "<table" in (tmp_path / "report.html").read_text()


def test_a_zero_shot_row_against_the_bilingual_model(runs: dict[str, Any], tmp_path: Path) -> None:
    found = report(runs, tmp_path, "de-fr", extra=("--zero-shot", f"de-fr={runs['zero_shot']}"))
    row = found["rows"][-1]
    assert row["direction"] == "de-fr" and row["zero_shot"] and found["mean"] is None
    refs, zs_hyps = runs["refs"]["de-fr"], runs["ml_hyps"]["de-fr"]
    assert row["multilingual"]["bleu_lc"] == pytest.approx(
        BLEU(lowercase=True).corpus_score(zs_hyps, [refs]).score
    )
    delta, p_value = direct_bootstrap(runs["bi_hyps"]["de-fr"], zs_hyps, refs)
    assert row["delta"] == pytest.approx(delta) and row["p_value"] == pytest.approx(p_value)
    assert delta < 0 and row["significant"] and p_value < 0.05
    assert "| de-fr (zero-shot) |" in (tmp_path / "report.md").read_text()


def test_a_multilingual_test_hyp_that_does_not_add_up_names_both_files(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "ml"
    broken.mkdir()
    (broken / ".hydra").symlink_to(runs["ml"] / ".hydra")
    lines = gzip.decompress((runs["ml"] / "test.hyp.gz").read_bytes()).decode().splitlines()
    (broken / "test.hyp").write_text("\n".join(lines[:-1]) + "\n")
    code = main(["--multilingual", str(broken), "--bilingual", str(runs["bilingual"]["de-en"])])
    error = capsys.readouterr().err
    assert code == 2 and f"{broken / 'test.hyp'} has {3 * TEST_LINES - 1} lines" in error
    assert f"have {3 * TEST_LINES}" in error and f"test_2016_flickr.fr.gz (en-fr): {TEST_LINES}" in error

    refs = {d: (Path(f"{d}.ref"), runs["refs"][d]) for d in DIRECTIONS}  # the split itself, by line counts
    split = split_by_direction(Path("test.hyp"), lines, refs)
    assert {d: split[d].hypotheses for d in DIRECTIONS} == {d: runs["ml_hyps"][d] for d in DIRECTIONS}


def test_mismatched_files_and_untrained_directions_are_refused(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = tmp_path / "zs.short"
    short.write_text("one line\n")
    base = ["--multilingual", str(runs["ml"]), "--bilingual", str(runs["bilingual"]["de-fr"])]
    assert main([*base, "--zero-shot", f"de-fr={short}"]) == 2
    error = capsys.readouterr().err
    assert f"{short} has 1 lines" in error and f"test_2016_flickr.fr.gz have {TEST_LINES}" in error
    assert main(base) == 2 and "--zero-shot DIRECTION=FILE" in capsys.readouterr().err
    assert main([*base, "--zero-shot", f"en-de={runs['zero_shot']}"]) == 2
    assert "was trained on it" in capsys.readouterr().err


def test_a_cased_run_and_a_stale_results_json_print_to_stdout(
    runs: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bilingual = tmp_path / "bi_de-en"
    bilingual.mkdir()
    config = OmegaConf.load(runs["bilingual"]["de-en"] / ".hydra" / "config.yaml")
    config.selection.metric = "bleu"  # chose on cased BLEU: the headline is cased BLEU
    write_run(bilingual, config, runs["bi_hyps"]["de-en"], {"test_bleu": 99.0}, packed=False)
    assert main(["--multilingual", str(runs["ml"]), "--bilingual", str(bilingual)]) == 0
    out = capsys.readouterr().out
    assert "| multilingual BLEU | bilingual BLEU |" in out and "the headline is cased BLEU" in out
    assert f"> warning: {bilingual}: test_bleu is 99.0 in results.json" in out
