"""scripts/quickstart.py (``make demo``) as a user runs it: it measures, chooses an experiment and prints
the train.py command (``--dry-run``); ``--recipe`` forces one; bad input stops before training. Nothing
trains: the one non-dry run replaces train.py's process by a stub."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from helpers.training import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "quickstart.py"


def quickstart(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
    )


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("script_quickstart", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_dry_run_measures_chooses_and_prints_the_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = quickstart("--dry-run", f"hydra.run.dir={run_dir}", "trainer.max_steps=2")
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip()
    assert "train.py experiment=quickstart" in command  # quickstart or quickstart_fp32
    assert "trainer.max_steps=2" in command and str(run_dir) in command
    assert "TFLOP/s" in done.stderr or "GPU" in done.stderr  # the reason, with its numbers
    assert not run_dir.exists()  # a dry run writes nothing


def test_a_forced_recipe_is_honoured(tmp_path: Path) -> None:
    done = quickstart("--recipe", "quickstart_fp32", "--dry-run", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    assert "train.py experiment=quickstart_fp32 " in done.stdout
    assert "forced" in done.stderr


def test_an_unknown_recipe_names_the_valid_ones() -> None:
    done = quickstart("--recipe", "fast", "--dry-run")
    assert done.returncode == 2 and not done.stdout
    assert "invalid choice: 'fast'" in done.stderr
    assert "'quickstart', 'quickstart_fp32'" in done.stderr


def test_an_experiment_override_is_refused() -> None:
    done = quickstart("--dry-run", "experiment=multi30k_transformer")
    assert done.returncode == 2 and "--recipe" in done.stderr


def test_the_choice_lands_in_the_run_before_training_and_the_exit_status_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = load_script()
    run_dir = tmp_path / "run"
    seen: list[list[str]] = []

    def train(command: list[str]) -> int:  # train.py's stand-in: recipe.json is already there
        seen.append(command)
        assert json.loads((run_dir / "recipe.json").read_text())["experiment"] == "quickstart_fp32"
        return 7

    monkeypatch.setattr(script, "run_training", train)
    assert script.main(["--recipe", "quickstart_fp32", f"hydra.run.dir={run_dir}", "seed=2"]) == 7
    assert seen[0][2:] == ["experiment=quickstart_fp32", "seed=2", f"hydra.run.dir='{run_dir}'"]
