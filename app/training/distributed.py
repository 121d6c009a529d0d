"""Small rank helpers for code that runs once per process of a distributed run.

Two situations need them. Before Lightning has initialised the process group (Hydra's logging set-up,
tokenizer training) a process can only learn its rank from the launcher's environment variables:
torchrun sets ``RANK``/``LOCAL_RANK``, SLURM ``SLURM_PROCID``/``SLURM_LOCALID``, Lightning's own
subprocess launcher ``LOCAL_RANK``/``NODE_RANK`` in the processes it starts (the launching process has
none of them and is rank 0). Inside ``trainer.fit`` the process group exists and Python objects such
as validation hypotheses can be gathered from every rank.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from omegaconf import OmegaConf

log = logging.getLogger(__name__)

# Every variable a launcher may set to a process's (global, node or local) rank.
_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK", "SLURM_LOCALID")
_LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def launched_as_rank_zero() -> bool:
    """True unless a launcher's environment says this process is not global rank 0.

    Rank 0 is the process where every rank variable that is set is 0: torchrun's ``RANK=0``, SLURM's
    first task, or the process that Lightning's subprocess launcher starts the others from.
    """
    return all(_env_int(name) in (None, 0) for name in _RANK_VARIABLES)


def launched_as_local_zero() -> bool:
    """True for the first process on its node (each node may have its own file system)."""
    return all(_env_int(name) in (None, 0) for name in _LOCAL_RANK_VARIABLES)


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


def wait_for_file(path: Path, *, timeout_s: float = 3600.0, poll_s: float = 1.0) -> None:
    """Block until ``path`` exists (written by another process, e.g. local rank 0); raise after a timeout."""
    deadline = time.monotonic() + timeout_s
    if not path.exists():
        log.info("waiting for %s (written by local rank 0)", path)
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s; is local rank 0 running?")
        time.sleep(poll_s)
