"""Rank helpers for a distributed run's processes that need Hydra or a process group.

Hydra's logging set-up (before Lightning has initialised the process group) writes one log file and one
``.hydra`` folder per run, on global rank 0, through the resolvers registered here; the rank comes from
the launcher's environment (:mod:`app.ranks`, below the data pipeline, which needs it too). Inside
``trainer.fit`` the process group exists and Python objects such as validation hypotheses can be
gathered from every rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
from omegaconf import OmegaConf

from app.checkpoint import last_learning_rate
from app.ranks import launched_as_rank_zero


def rank_zero_log_file(run_dir: str, name: str = "train.log") -> str:
    """``run_dir/name`` on global rank 0, the null device elsewhere: one log file per run, not per rank.

    Used by Hydra's job-logging config (resolver ``rank_zero_log``); console logging is unaffected.
    """
    return str(Path(run_dir) / name) if launched_as_rank_zero() else os.devnull


def rank_zero_value(value: Any) -> Any:
    """``value`` on global rank 0, ``None`` elsewhere (e.g. Hydra's ``output_subdir``: one .hydra folder)."""
    return value if launched_as_rank_zero() else None


def register_resolvers() -> None:
    """Register the OmegaConf resolvers that conf/train.yaml uses (idempotent)."""
    if not OmegaConf.has_resolver("rank_zero_log"):
        OmegaConf.register_new_resolver("rank_zero_log", rank_zero_log_file)
    if not OmegaConf.has_resolver("rank_zero"):
        OmegaConf.register_new_resolver("rank_zero", rank_zero_value)
    if not OmegaConf.has_resolver("checkpoint_lr"):  # ${checkpoint_lr:PATH}: where a run stopped
        OmegaConf.register_new_resolver("checkpoint_lr", last_learning_rate, use_cache=True)


def is_distributed() -> bool:
    """True inside a process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; ``[obj]`` when not distributed."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered
