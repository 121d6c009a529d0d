"""This project's Hydra plugins: the resumable Optuna sweeper of ``sweep=tune``."""
