"""Which process of a distributed run this is, from the launcher's environment, before any process group.

Code below training needs this too: the data pipeline trains a tokenizer and encodes the corpus on the
first process of each node while the others wait for its files. A process that has no process group yet
can only learn its rank from the variables its launcher set: torchrun sets ``RANK``/``LOCAL_RANK``,
SLURM ``SLURM_PROCID``/``SLURM_LOCALID``, Lightning's own subprocess launcher ``LOCAL_RANK``/``NODE_RANK``
in the processes it starts (the launching process has none of them and is rank 0). The helpers that need
a process group or Hydra (gathering objects, config resolvers) live in :mod:`app.training.distributed`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

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


def wait_for_file(path: Path, *, timeout_s: float = 3600.0, poll_s: float = 1.0) -> None:
    """Block until ``path`` exists (written by another process, e.g. local rank 0); raise after a timeout."""
    deadline = time.monotonic() + timeout_s
    if not path.exists():
        log.info("waiting for %s (written by local rank 0)", path)
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s; is local rank 0 running?")
        time.sleep(poll_s)
