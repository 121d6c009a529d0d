"""The uptraining ablation's report (experiment=ablation_uptrain, app/reports/uptrain.py): the converted
arm (warm start, X steps) and the scratch arm (B + X steps) are separate groups, lined up variant by
variant with the paired tests, converted against scratch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.reports.render import markdown
from app.reports.uptrain import uptrain_sections
from app.reports.variants import group_runs, sweep_runs

REFS = [
    "a dog runs in the park .",
    "two men sit on a bench .",
    "a woman reads a big book .",
    "kids play .",
] * 3
WRONG = ["a cat", "three birds fly away", "the man eats soup", "nobody"] * 3
ATTENTION = {"eager": {"kernel": "eager"}, "eager kv=1": {"kernel": "eager", "num_kv_heads": 1}}


def make_job(sweep: Path, data: Path, arm: str, variant: str, seed: int, base: Path, good: int) -> None:
    """One finished job whose test translations get the first ``good`` of every four sentences right."""
    run = sweep / f"arm={arm},{variant.replace(' ', '_')},seed={seed}"
    (run / ".hydra").mkdir(parents=True)
    config: dict[str, Any] = {
        "seed": seed, "attention": ATTENTION[variant],
        "model": {"family": "transformer", "d_model": 32, "num_heads": 4, "decoder_layers": 2},
        "data": {"files": {"test": {"src": str(data / "test.de"), "tgt": str(data / "test.en")}}},
        "trainer": {"max_steps": 40 if arm == "converted" else 440},
        "init_from": str(base) if arm == "converted" else None,
    }  # fmt: skip
    (run / ".hydra" / "config.yaml").write_text(json.dumps(config))
    (run / "train.log").write_text("")
    hyps = [ref if i % 4 < good else wrong for i, (ref, wrong) in enumerate(zip(REFS, WRONG, strict=True))]
    (run / "test.hyp").write_text("\n".join(hyps) + "\n")
    bleu = 25.0 * good
    results = {"parameters": 1000, "global_step": config["trainer"]["max_steps"], "test_bleu": bleu,
               "test_bleu_lc": bleu, "test_chrf": bleu}  # fmt: skip
    (run / "results.json").write_text(json.dumps(results))


def test_the_arms_are_lined_up_per_variant_with_their_tests(tmp_path: Path) -> None:
    data, sweep, base_run = tmp_path / "data", tmp_path / "sweep", tmp_path / "base"
    data.mkdir()
    (data / "test.de").write_text("\n".join(["x"] * len(REFS)) + "\n")
    (data / "test.en").write_text("\n".join(REFS) + "\n")
    (base_run / "checkpoints").mkdir(parents=True)
    (base_run / "results.json").write_text(json.dumps({"global_step": 400, "test_bleu": 74.5}))
    base = base_run / "checkpoints" / "best.ckpt"
    for seed in (1, 2):  # converted MQA beats scratch MQA; MHA is equal in both arms
        for arm, variant, good in [("converted", "eager", 3), ("scratch", "eager", 3),
                                   ("converted", "eager kv=1", 3), ("scratch", "eager kv=1", 1)]:  # fmt: skip
            make_job(sweep, data, arm, variant, seed, base, good)
    groups, _ = group_runs(sweep_runs(sweep))
    assert [g.held["budget"]["trainer.max_steps"] for g in groups] == [40, 440]  # two groups: never compared
    rows = [  # the report's own rows of each group (app/reports/report.py), the columns the section reads
        [{"variant": v.name, "bleu": v.result("test_bleu")[0], "bleu_std": 0.0, "decode_sent_s_greedy": None,
          "delta_bleu": None} for v in group.variants]
        for group in groups
    ]  # fmt: skip
    section = markdown(uptrain_sections(groups, rows))
    assert section.startswith("## Converted and uptrained against trained from scratch")
    assert (
        f"each job starts from {base} (test BLEU 74.5 as trained)" in section
        and "then trains 40 steps (10% of the base's 400 steps)" in section
    )
    assert "for 440 steps, the same total budget" in section
    mqa = next(line for line in section.splitlines() if line.startswith("| eager kv=1 |"))
    cells = [cell.strip() for cell in mqa.strip("|").split("|")]
    assert cells[1:4] == ["40 / 440", "75.0 ± 0.0", "25.0 ± 0.0"]
    assert cells[4].startswith("+") and cells[5].endswith("*")  # the paired test finds the difference
    assert "- eager kv=1: converted +" in section and "over seeds p" in section
    assert "; +0.50 against the base model (74.5)" in section  # each variant against the MHA model as trained
    assert "| eager | 40 / 440 | 75.0 ± 0.0 | 75.0 ± 0.0 | +0.00" in section


def test_a_variant_with_one_seed_on_a_side_is_said_so(tmp_path: Path) -> None:
    data, sweep, base = tmp_path / "data", tmp_path / "sweep", tmp_path / "base" / "checkpoints" / "best.ckpt"
    data.mkdir()
    (data / "test.de").write_text("\n".join(["x"] * len(REFS)) + "\n")
    (data / "test.en").write_text("\n".join(REFS) + "\n")
    for arm, seed in [("converted", 1), ("converted", 2), ("scratch", 1)]:  # scratch's seed 2 unfinished
        make_job(sweep, data, arm, "eager", seed, base, 3 if arm == "converted" else 2)
    groups, _ = group_runs(sweep_runs(sweep))
    rows = [
        [{"variant": v.name, "bleu": v.result("test_bleu")[0], "decode_sent_s_greedy": None,
          "delta_bleu": None, "bleu_std": 0.0 if len(v.runs) > 1 else None} for v in group.variants]
        for group in groups
    ]  # fmt: skip
    section = markdown(uptrain_sections(groups, rows))
    assert "| eager | 40 / 440 | 75.0 ± 0.0 | 50.0 (1 seed) | +" in section
    assert "*; no test over seeds: one seed on a side)" in section
    assert "None" not in section
