"""Does a change keep the training-loss curve? Two runs of one config and seed, compared step by step.

Two runs with the same seed train on the same batches in the same order, so the difference of their
logged training losses at one step is what the change did plus the noise that other dropout masks or
rounding make. The test is paired over the logged steps below ``until``: the mean difference B - A,
a 95% bootstrap interval for it, and the p-value of a sign-flip permutation test (under "the change
does nothing", each step's difference is as likely to have either sign). A faithful change leaves the
mean difference small and not significant; windows of steps show where a difference arises.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.reports.render import Table, markdown_table
from app.reports.runs import read_metrics, series

LOSS = "train/loss"
RESAMPLES = 10_000


@dataclass(frozen=True)
class Window:
    first: int  # first and last step of the window that both runs logged
    last: int
    steps: int  # logged steps in the window
    loss_a: float  # mean training loss of run A, of run B
    loss_b: float
    difference: float  # mean of B - A over the window's steps


@dataclass(frozen=True)
class LossComparison:
    windows: list[Window]
    total: Window  # every compared step
    interval: tuple[float, float]  # 95% bootstrap interval of total.difference
    p_value: float  # sign-flip permutation test of "mean difference = 0"


def losses_by_step(run_dir: Path) -> dict[int, float]:
    steps, losses = series(read_metrics(run_dir), "step", LOSS)
    return {int(step): loss for step, loss in zip(steps, losses, strict=True)}


def summarise(steps: list[int], a: dict[int, float], b: dict[int, float]) -> Window:
    return Window(
        first=steps[0],
        last=steps[-1],
        steps=len(steps),
        loss_a=statistics.fmean(a[s] for s in steps),
        loss_b=statistics.fmean(b[s] for s in steps),
        difference=statistics.fmean(b[s] - a[s] for s in steps),
    )


def compare_losses(run_a: Path, run_b: Path, *, until: int, window: int, seed: int = 0) -> LossComparison:
    """The paired comparison over the steps below ``until`` that both runs logged a loss at."""
    a, b = losses_by_step(run_a), losses_by_step(run_b)
    common = sorted(step for step in set(a) & set(b) if step < until)
    if len(common) < 2:
        raise ValueError(f"{run_a} and {run_b} logged {LOSS} at {len(common)} common step(s) below {until}")
    windows = [
        summarise(part, a, b)
        for start in range(0, until, window)
        if (part := [s for s in common if start <= s < start + window])
    ]
    differences = np.array([b[s] - a[s] for s in common])  # (N,)
    rng = np.random.default_rng(seed)
    resampled = differences[rng.integers(0, len(differences), (RESAMPLES, len(differences)))].mean(axis=1)
    flipped = (differences * rng.choice([-1.0, 1.0], (RESAMPLES, len(differences)))).mean(axis=1)
    observed = abs(differences.mean())
    return LossComparison(
        windows=windows,
        total=summarise(common, a, b),
        interval=(float(np.percentile(resampled, 2.5)), float(np.percentile(resampled, 97.5))),
        p_value=float((1 + np.sum(np.abs(flipped) >= observed - 1e-12)) / (1 + RESAMPLES)),
    )


def windows_table(result: LossComparison) -> Table:
    """Per window and in total: the logged steps, each run's mean loss and the difference."""
    rows = [
        [f"{'all ' if w is result.total else ''}{w.first}-{w.last}", str(w.steps),
         f"{w.loss_a:.4f}", f"{w.loss_b:.4f}", f"{w.difference:+.4f}"]
        for w in [*result.windows, result.total]
    ]  # fmt: skip
    return Table(("steps", "logged", "loss A", "loss B", "B - A"), rows)


def loss_comparison_markdown(result: LossComparison, name_a: str, name_b: str) -> str:
    """The runs, :func:`windows_table`, and the test under the table."""
    low, high = result.interval
    verdict = "not significant" if result.p_value >= 0.05 else "significant"
    return (
        f"A: {name_a}\nB: {name_b}\n\n"
        + markdown_table(windows_table(result))
        + f"\n\nB - A over all {result.total.steps} steps: {result.total.difference:+.4f}, 95% interval "
        f"{low:+.4f} .. {high:+.4f}, sign-flip p = {result.p_value:.3f} ({verdict} at 0.05)"
    )
