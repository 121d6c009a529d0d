"""Train a translation model: ``python train.py experiment=quickstart`` (see conf/train.yaml).

In a sweep (``python train.py -m ...``) every job runs in a process of its own, and a failed job is
recorded in its directory instead of ending the sweep; when the sweep ends, the exit status is non-zero
if any job failed, and the last line names them (:mod:`app.training.sweep`).
"""

import logging
import sys

try:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from app.training.distributed import register_resolvers
    from app.training.sweep import sweep_job
except KeyboardInterrupt:  # Ctrl-C while torch and Lightning load: as quiet as one later
    sys.exit(130)

register_resolvers()  # before Hydra reads conf/train.yaml


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    """A single run trains here; a sweep's job trains in a child process and returns its exit code, or
    for a tuning sweep its best validation score (``sweep_returns``; Hydra keeps it in the job's return,
    and the sweep's exit status comes from the jobs' FAILED files)."""
    logging.getLogger("app").setLevel(logging.INFO)
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        return sweep_job(cfg)
    from app.training.task import train_or_exit  # here: a sweep's own process only starts jobs, no Lightning

    train_or_exit(cfg)  # a run refused for a reason it names: one error: line, exit status 2
    return None


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C: stop quietly with the shell's status for it (128 + SIGINT)
        sys.exit(130)
