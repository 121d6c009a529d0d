"""The GPU check (scripts/gpu_check.sh, app/bench/gpu_check.py): its plan on a GPU (issue 48's rows, the
GPU tests found by their skip markers, flex and the packed layout picked up when a checkout has them),
its time boxes (a failing or overrunning step is recorded and the next one runs), and one real run at a
tiny size on the CPU, report included."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.gpu_tests import needs_a_gpu
from helpers.training import REPO_ROOT, subprocess_env

from app.bench import gpu_check, gpu_env, gpu_plan
from app.bench.attention_cases import TRAIN_CASES
from app.bench.gpu_plan import Outcome, Settings, Step
from app.bench.gpu_report import write_report


def gpu_settings(tmp_path: Path, root: Path = REPO_ROOT) -> Settings:
    return Settings(device="cuda", tiny=False, work=tmp_path, root=root)


def test_on_a_gpu_the_plan_measures_the_issues_rows_after_the_gpu_tests(tmp_path: Path) -> None:
    steps = {step.name: step for step in gpu_plan.plan(gpu_settings(tmp_path))}
    kernels = gpu_plan.detected_kernels()
    assert list(steps)[:4] == ["env", "install", "tests", "attention"]
    assert [name for name in steps if name.startswith("train:")] == [f"train:{k}" for k in kernels]
    assert kernels[:3] == ("eager", "sdpa", "flash")
    eager = steps["train:eager"].command
    for override in [
        "experiment=multi30k_transformer",
        "model=transformer",
        "trainer.accelerator=gpu",
        "trainer.precision=bf16-mixed",
        "attention=eager",
        "data.max_tokens=16384,65536",
    ]:
        assert override in eager
    assert "--keep-going" in eager and eager[1] == "scripts/bench_train.py"
    assert "compile_model=true" in steps["compile"].command
    attention = steps["attention"].command
    assert attention[attention.index("--lengths") + 1] == "16384"
    cases = attention[attention.index("--variants") + 1 : attention.index("--decode-lengths")]
    assert cases[:3] == ["eager", "sdpa", "sparse_window256"]
    assert set(cases) <= {case.name for case in TRAIN_CASES}  # names bench_attention.py accepts
    assert (
        "data.concat=256" in steps["length"].command
        and "experiment=quickstart" in steps["short-train"].command
    )
    assert sum(step.min_s for step in steps.values()) < gpu_check.DEFAULT_BUDGET_S  # each can start in turn


def test_the_gpu_tests_are_found_by_their_skip_markers(tmp_path: Path) -> None:
    files = [str(path.relative_to(REPO_ROOT)) for path in gpu_plan.gpu_test_files()]
    assert {"tests/integration/test_gpu.py", "tests/unit/test_attention_variants.py"} <= set(files)
    assert "tests/unit/test_shared_cross_keys.py" in files and "tests/scripts/test_gpu_check.py" not in files
    tests = gpu_plan.tests_step(gpu_settings(tmp_path)).command
    assert tests[tests.index("-m", 3) + 1] == "slow or not slow" and "helpers.gpu_tests" in tests
    assert set(files) <= set(tests)


@pytest.mark.skipif(False, reason="needs a CUDA GPU")  # never skips: the plugin reads the reason alone
def test_the_plugin_keeps_a_test_marked_for_a_gpu(request: pytest.FixtureRequest) -> None:
    assert needs_a_gpu(request.node)


def test_the_plugin_drops_a_test_without_such_a_marker(request: pytest.FixtureRequest) -> None:
    assert not needs_a_gpu(request.node)


def test_flex_and_the_packed_layout_are_measured_once_a_checkout_has_them(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    for part in ("conf/attention", "conf/data", "app/bench", "tests"):
        (root / part).mkdir(parents=True)
    shutil.copy(REPO_ROOT / "app/bench/attention_cases.py", root / "app/bench/attention_cases.py")
    (root / "conf/data/multi30k.yaml").write_text("dir: data/multi30k\n")
    before = gpu_plan.plan(gpu_settings(tmp_path, root))
    assert "train:flex" not in [s.name for s in before] and not any(
        "data.layout" in c for c in before[3].command
    )

    (root / "conf/attention/flex.yaml").write_text("kernel: flex\n")
    (root / "conf/data/multi30k.yaml").write_text("dir: data/multi30k\nlayout: padded   # padded | packed\n")
    with (root / "app/bench/attention_cases.py").open("a") as handle:
        handle.write('\nFLEX = [KernelCase("flex_window256", "flex", {"window": 256}),\n')
        handle.write('        KernelCase(name="flex_causal", kernel="flex")]\n')
    steps = {s.name: s for s in gpu_plan.plan(gpu_settings(tmp_path, root))}
    assert "data.layout=padded,packed" in steps["train:flex"].command  # padded rows first
    assert (
        "flex_window256" in steps["attention"].command
        and "attention=eager,sdpa,sparse,flex" in steps["length"].command
    )


def test_only_names_steps_or_kinds_and_refuses_others(tmp_path: Path) -> None:
    steps = gpu_plan.plan(gpu_settings(tmp_path))
    assert [s.name for s in gpu_plan.select(steps, ["compile", "train:sdpa"])] == ["train:sdpa", "compile"]
    assert all(s.kind == "train" for s in gpu_plan.select(steps, ["train"]))
    with pytest.raises(ValueError, match=r"unknown step\(s\) trian; valid: attention, compile, env"):
        gpu_plan.select(steps, ["trian"])


def python_step(name: str, code: str, box_s: float = 30) -> Step:
    return Step(name, "env", [sys.executable, "-c", code], box_s=box_s, min_s=0)


def test_a_failing_or_overrunning_step_is_recorded_and_the_next_one_runs(tmp_path: Path) -> None:
    settings = Settings(device="cpu", tiny=True, work=tmp_path / "work")
    steps = [
        python_step("breaks", "print('half way'); raise SystemExit('broken: no such kernel')"),
        python_step("hangs", "import time; print('waiting', flush=True); time.sleep(60)", box_s=1),
        python_step("works", "print('fine')"),
        Step("late", "length", ["true"], box_s=60, min_s=10_000),  # more than the budget leaves
    ]
    outcomes = gpu_check.run_check(steps, settings, tmp_path / "out", 120, ["OUT", "--device", "cpu"])
    assert [o.status for o in outcomes] == ["failed", "timed out", "ok", "not run"]
    assert outcomes[0].tail[-2:] == ["half way", "broken: no such kernel"] and outcomes[0].returncode == 1
    assert outcomes[1].tail[-1] == "waiting" and outcomes[1].seconds < 15
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["rerun"] == "bash scripts/gpu_check.sh $OUT --device cpu --only breaks hangs late"
    page = (tmp_path / "out" / "report.md").read_text()
    assert "### breaks: failed (exit status 1)" in page and "| late | not run | 0.0 |" in page
    assert "===== works: ok\n$ " in (tmp_path / "out" / "log.txt").read_text()


def test_the_install_step_installs_only_where_a_module_is_missing(tmp_path: Path) -> None:
    """Here every module the wheels provide is found: nothing installed. A missing one with no wheels
    carried fails the step, naming the module and the fix."""
    here = Settings(device="cpu", tiny=True, work=tmp_path, python=sys.executable)
    outcome = gpu_check.run_step(gpu_plan.install_step(here), here, tmp_path / "here.log", 60)
    assert outcome.status == "ok"
    assert (tmp_path / "here.log").read_text().endswith("datasets sacremoses: nothing to install\n")
    bare = Settings(
        device="cpu",
        tiny=True,
        work=tmp_path,
        python=sys.executable,
        wheels=tmp_path / "none",
        imports=("hydra", "no_such_module_here"),
    )
    outcome = gpu_check.run_step(gpu_plan.install_step(bare), bare, tmp_path / "bare.log", 60)
    assert outcome.status == "failed" and outcome.tail[-1] == (
        f"error: hydra no_such_module_here missing and no wheels in {tmp_path / 'none'} "
        "(make gpu-bundle, then carry .whl)"
    )


def test_a_tiny_check_on_the_cpu_runs_its_steps_for_real_and_reports(tmp_path: Path) -> None:
    """scripts/gpu_check.sh at a tiny size on the CPU, one real step (the attention benchmark): its
    rows, timed by the product, reach report.json and report.md, and OUTDIR holds the three files."""
    out, work = tmp_path / "out", tmp_path / "work"
    args = ["--device", "cpu", "--tiny", "--work", str(work), "--only", "attention"]
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", str(out), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**subprocess_env(), "PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert [(s["name"], s["status"]) for s in report["steps"]] == [("attention", "ok")]
    rows = {r["variant"]: r for r in report["attention"]}
    # the issue's three rows, and the flex cases where the checkout's attention benchmark has them
    assert set(rows) == set(gpu_plan.attention_cases(REPO_ROOT)) and rows["sdpa"]["x_sdpa_time"] == 1.0
    assert {"eager", "sdpa", "sparse_window256"} <= set(rows)
    assert all(float(r["time_ms"]) > 0 and r["length"] == "64" for r in rows.values())
    assert report["rerun"] is None and report["check"]["tiny"]
    page = (out / "report.md").read_text()
    assert "## One attention layer, forward + backward" in page and "| sdpa | 64 |" in page
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "report.json", "report.md"]


def test_the_report_names_the_machine_and_compares_compile_with_eager_mode(tmp_path: Path) -> None:
    """The report's heading from this machine's real environment; compile's row against the eager
    kernel's training row of the same shape; an unknown kernel refused before anything runs."""
    (tmp_path / "env.json").write_text(json.dumps(gpu_env.environment()))
    rows = [{"overrides": ["attention=eager", "data.max_tokens=16384"], "tokens_per_s": 100, "mfu": 0.1}]
    (tmp_path / "train_eager.jsonl").write_text(json.dumps(rows[0]) + "\n")
    compiled = {
        "overrides": ["attention=eager", "data.max_tokens=16384", "compile_model=true"],
        "warmup_s": 42.5,
    }
    (tmp_path / "compile.jsonl").write_text(json.dumps(compiled | {"tokens_per_s": 130}) + "\n")
    outcomes = [
        Outcome("train:eager", "train", "ok", output="train_eager.jsonl"),
        Outcome("compile", "compile", "ok", output="compile.jsonl"),
    ]
    settings = Settings(device="cpu", tiny=True, work=tmp_path)
    report = write_report(tmp_path / "out", outcomes, settings, elapsed=1.0, budget_s=330, argv=["OUT"])
    assert report["compile"][0]["x_eager"] == 1.3 and report["compile"][0]["warmup_s"] == 42.5
    page = (tmp_path / "out" / "report.md").read_text()
    assert page.startswith(f"# GPU check: no GPU, torch {torch.__version__} (CUDA ")
    assert f"{os.cpu_count()} CPUs" in page and "| eager | 16384 | 130 | 1.30 |" in page


def test_a_kernel_the_checkout_lacks_is_refused_naming_the_valid_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert gpu_check.main(["OUT", "--list", "--kernels", "eager", "nope"]) == 2
    assert "error: unknown kernel(s) nope for --kernels; valid: " in capsys.readouterr().err
