"""The Optuna sweeper of ``sweep=tune``: hydra-optuna-sweeper's, made to resume a study it finds in storage.

Hydra instantiates sweepers only from modules under the ``hydra_plugins`` namespace, so this class lives
here (no ``__init__.py`` above it: the namespace is shared with the installed plugins); what it does is
:func:`app.training.tuning.resume_study`. Without the ``tune`` extra installed, this module defines nothing
(and Hydra, which imports every plugin module at start, has nothing to warn about).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

try:
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
except ImportError:  # pip install -e '.[tune]' brings it
    OptunaSweeper = None

log = logging.getLogger(__name__)

if OptunaSweeper is not None:

    class ResumableOptunaSweeper(OptunaSweeper):
        """hydra-optuna-sweeper's ``OptunaSweeper``; a study found in its storage is continued: up to
        ``n_trials`` finished trials in all, job numbers after the study's trials, interrupted trials
        failed and their values tried again."""

        def sweep(self, arguments: list[str]) -> Any:
            from app.training.tuning import no_trial_completed, resume_study, trials_to_run  # imports optuna

            impl = self.sweeper  # the plugin's implementation: it reads n_trials and job_idx when sweeping
            start = resume_study(impl.storage, impl.study_name, Path(impl.sweep_dir))
            wanted = impl.n_trials
            impl.n_trials = trials_to_run(wanted, start)
            impl.job_idx = start.next_job
            if start.finished or start.requeued:
                log.info(
                    "study %s: %d of %d trials finished, %d to run, the next one trial_%d",
                    impl.study_name, start.finished, wanted, impl.n_trials, start.next_job,
                )  # fmt: skip
            if impl.n_trials == 0:
                return None  # the study is complete: the summary callback still reports it
            try:
                return impl.sweep(arguments)
            except ValueError:  # its closing "best trial" when every trial failed: let the callbacks report
                if not no_trial_completed(impl.storage, impl.study_name):
                    raise
                log.error("study %s: no trial completed", impl.study_name)
                return None
