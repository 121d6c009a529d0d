"""Helpers for tests that train for real: a Multi30k slice on disk, tiny-run overrides, train.py runs.

Subprocess runs go through ``train.py`` exactly as a user's would (Hydra, Lightning's launcher), with
``PYTHONPATH`` set to this checkout so that the ranks Lightning starts import the same code.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the end-to-end runs train on: enough for the loss to fall visibly in a few dozen steps.
END_TO_END_SLICE = {"train": 3000, "val": 200, "test_2016_flickr": 100}


def read_gz_lines(path: Path, limit: int) -> list[str]:
    """The first ``limit`` lines of a gzipped text file, without their newlines."""
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for _, line in zip(range(limit), handle, strict=False)]


def write_corpus_slice(multi30k_dir: Path, out: Path, sizes: dict[str, int]) -> Path:
    """Plain-text de/en files holding the first ``sizes[split]`` lines of each Multi30k split."""
    out.mkdir(parents=True, exist_ok=True)
    for split, lines in sizes.items():
        for lang in ("de", "en"):
            with gzip.open(multi30k_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as src:
                text = "".join(line for _, line in zip(range(lines), src, strict=False))
            (out / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return out


def logged_column(metrics_csv: Path, name: str) -> list[float]:
    """The values of one column of a run's csv/metrics.csv, rows without it left out."""
    with metrics_csv.open() as handle:
        return [float(row[name]) for row in csv.DictReader(handle) if row.get(name)]


def run_translate(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``python translate.py ARGS`` from the checkout, as a user would run it; returns what it printed."""
    return subprocess.run(
        [sys.executable, "translate.py", *args], input=stdin, capture_output=True, cwd=REPO_ROOT, timeout=300
    )


def tiny_overrides(corpus: Path, run_dir: Path, cache_dir: Path, *extra: str) -> list[str]:
    """Hydra overrides for a small fp32 model on a corpus slice: fast, and exact enough to compare runs."""
    return [
        f"data.dir={corpus}",
        "data.fetch=null",
        f"data.cache_dir={cache_dir}",
        "data.subword.vocab_size=500",
        "data.max_tokens=800",
        "model.d_model=32",
        "model.num_heads=4",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_ff=64",
        "model.max_positions=64",
        "optim.lr=3e-3",
        "optim.warmup_steps=10",
        "trainer.accelerator=cpu",
        "trainer.precision=32-true",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "valid_search.max_len=40",
        "test_search.beam=1",
        "test_search.max_len=40",
        f"output_dir={run_dir}",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def subprocess_env() -> dict[str, str]:
    """The environment for train.py children: this checkout first on the path, one thread per process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("LOCAL_RANK", None)
    return env


def train_command(overrides: list[str]) -> list[str]:
    return [sys.executable, "train.py", *overrides]


def run_train(
    overrides: list[str], timeout: float = 300, *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python train.py OVERRIDES`` to completion; fails the test with its output if it hangs, or if it
    fails while ``check`` (False: the caller judges its exit status, e.g. a sweep with a failed job)."""
    result = subprocess.run(
        train_command(overrides),
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert not check or result.returncode == 0, (
        f"train.py failed ({result.returncode}):\n{result.stderr[-4000:]}"
    )
    return result


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The records ``debug.trace_batches`` wrote, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compose_train(overrides: list[str]) -> Any:
    """The composed train config for in-process runs (Hydra's own ``hydra.*`` overrides left out)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")])
