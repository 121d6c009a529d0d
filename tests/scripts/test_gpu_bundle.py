"""The GPU check's wheels (scripts/gpu_bundle.py, app/bench/gpu_bundle.py): what it carries covers what
the check imports and the GPU image lacks, with every requirement met, under the device tool's limit."""

from __future__ import annotations

import importlib.metadata
import subprocess
import zipfile
from pathlib import Path

import pytest
from helpers.training import REPO_ROOT

from app.bench import gpu_bundle
from app.bench.gpu_bundle import BUNDLE, IMAGE_PACKAGES, normalize
from app.bench.gpu_plan import CHECK_IMPORTS


def test_the_bundle_carries_what_the_check_imports_and_the_image_lacks() -> None:
    needed = gpu_bundle.needed_distributions()
    assert gpu_bundle.uncovered(needed) == {}
    assert {"hydra", "omegaconf", "datasets", "sacremoses", "torch", "pytorch_lightning"} <= set(needed)
    assert not {normalize(name) for name in BUNDLE} & IMAGE_PACKAGES  # nothing carried that is there
    assert {needed[module] for module in CHECK_IMPORTS} <= set(BUNDLE)  # the install step looks for those
    imported = set(needed.values())
    required = {
        normalize(r.split(";")[0].split("=")[0].split("<")[0].split(">")[0].strip())
        for name in BUNDLE
        for r in importlib.metadata.requires(name) or []
    }
    launcher = "hydra/launcher: joblib" in (REPO_ROOT / "conf/sweep/ablation.yaml").read_text()
    for name in BUNDLE:  # each is imported, needed by another, or named by a config (the length row's)
        assert normalize(name) in imported | required or (name == "hydra-joblib-launcher" and launcher), name


def test_each_bundled_package_finds_its_requirements_on_the_image_or_in_the_bundle() -> None:
    installed = {name: importlib.metadata.requires(name) or [] for name in BUNDLE}
    assert gpu_bundle.unresolved_requirements(installed) == {}
    lines = ["numpy>=1", "nonesuch>=1", "colorama; sys_platform == 'win32'", "pytest; extra == 'test'"]
    assert gpu_bundle.unresolved_requirements({"x": lines}) == {"x": ["nonesuch>=1"]}


def test_only_what_a_module_imports_when_imported_counts(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nimport torch\nfrom hydra.core import x\n"
        "try:\n    import flash_attn\nexcept ImportError:\n    flash_attn = None\n"
        "if TYPE_CHECKING:\n    import pandas\n"
        "def f():\n    import ctranslate2\n"
    )
    every, eager = gpu_bundle.file_imports(module)
    assert {"torch", "hydra.core", "hydra.core.x", "typing"} <= eager
    assert not {"flash_attn", "pandas", "ctranslate2"} & eager and "ctranslate2" in every


def test_a_wheels_requirements_are_read_from_its_metadata(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: dill<0.4.2\n\nlong description\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo-1.0.dist-info/METADATA", meta + "Requires-Dist: not-a-header\n")
    assert gpu_bundle.wheel_requires(wheel) == ("demo", ["dill<0.4.2"])


def test_dry_run_prints_coverage_sizes_and_the_run_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_bundle.main(["--dry-run", "--carry", "tests/fixtures/multi30k"]) == 0
    out = capsys.readouterr().out
    assert "datasets             datasets                 bundle" in out
    assert "of the device tool's 64 MiB" in out and "tests/fixtures/multi30k 0." in out
    assert (
        'run(command="bash scripts/gpu_check.sh $OUT", carry=["tests/fixtures/multi30k"], timeout_s=420)'
        in out
    )
    ignored = subprocess.run(["git", "check-ignore", "-q", ".whl/x.whl"], cwd=REPO_ROOT, check=False)
    assert ignored.returncode == 0  # the wheels never reach a commit
