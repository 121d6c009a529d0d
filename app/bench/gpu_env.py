"""The machine and versions a GPU check ran on, as one JSON object (the check's first step).

python3 -m app.bench.gpu_env --out env.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from app.hardware import cpu_description

# The versions that decide what the check measures: the framework, the kernels' libraries, the data path.
PACKAGES = (
    "torch",
    "triton",
    "pytorch-lightning",
    "flash-attn",
    "hydra-core",
    "omegaconf",
    "datasets",
    "pyarrow",
    "fsspec",
    "huggingface-hub",
    "sentencepiece",
    "sacrebleu",
    "sacremoses",
    "numpy",
)


def version(name: str) -> str | None:
    """An installed distribution's version, or None where it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def driver() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (None without one)."""
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def environment() -> dict[str, Any]:
    """GPU (name, memory, capability, driver), torch/CUDA/cuDNN, Python, CPU, and package versions."""
    gpu = torch.cuda.is_available()
    props = torch.cuda.get_device_properties(0) if gpu else None
    return {
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "gpu_count": torch.cuda.device_count() if gpu else 0,
        "gpu_memory_mib": props.total_memory // 2**20 if props else None,
        "capability": f"{props.major}.{props.minor}" if props else None,
        "driver": driver() if gpu else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if gpu else None,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        **cpu_description(),
        "packages": {name: version(name) for name in PACKAGES},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    text = json.dumps(environment(), indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
