"""A pytest plugin that keeps only the GPU tests: those with a ``skipif`` marker whose reason names CUDA
or a GPU (``needs a CUDA GPU``), on the test, its class or its module (``pytestmark``), or on one of its
parameters. The GPU check (app/bench/gpu_plan.py) runs it over the files that hold such markers:

    PYTHONPATH=tests python -m pytest -m "slow or not slow" -p helpers.gpu_tests tests/integration/test_gpu.py
"""

from __future__ import annotations

import re

import pytest

GPU_REASON = re.compile(r"\b(CUDA|GPUs?)\b")


def needs_a_gpu(item: pytest.Item) -> bool:
    """True for a test skipped, by a marker, where no CUDA GPU is (whether or not one is here)."""
    return any(GPU_REASON.search(str(mark.kwargs.get("reason", ""))) for mark in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect every test that does not need a GPU (pytest reports them as deselected)."""
    keep = [item for item in items if needs_a_gpu(item)]
    dropped = [item for item in items if not needs_a_gpu(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
