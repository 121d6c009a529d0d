"""Optimizer and learning-rate schedules.

Every schedule warms up linearly to the peak rate, then decays:

- ``inverse_sqrt`` (Vaswani et al. 2017, section 5.3): proportional to 1/sqrt(step), without an end;
- ``cosine``: half a cosine from the peak down to zero at ``decay_steps``, then zero;
- ``linear``: a straight line from the peak down to zero at ``decay_steps``, then zero.

The two that end suit a fixed budget: set ``decay_steps`` to the steps it buys (``trainer.max_steps``),
so the last updates are small ones instead of the noisy steps inverse_sqrt still takes at its end. Under a
wall-clock budget the step count is the machine's to say: ``decay_steps=auto`` leaves it to
:class:`app.training.callbacks.DecayToTimeBudget`, which estimates it from the measured rate while training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from app.errors import ConfigError


def inverse_sqrt_factor(step: int, warmup: int) -> float:
    """Linear warm-up to 1 over ``warmup`` steps, then decay proportional to 1/sqrt(step)."""
    step = max(step, 1)
    if step < warmup:
        return step / warmup
    return math.sqrt(warmup / step)


def _decay_progress(step: int, warmup: int, decay_steps: int) -> float:
    """How far ``step`` is through the decay phase (warmup..decay_steps), clamped to [0, 1]."""
    return min(max((step - warmup) / max(decay_steps - warmup, 1), 0.0), 1.0)


def cosine_factor(step: int, warmup: int, decay_steps: int) -> float:
    """Linear warm-up to 1, then half a cosine down to 0 at ``decay_steps`` (0 after it)."""
    step = max(step, 1)
    if step < warmup:
        return step / warmup
    return 0.5 * (1.0 + math.cos(math.pi * _decay_progress(step, warmup, decay_steps)))


def linear_factor(step: int, warmup: int, decay_steps: int) -> float:
    """Linear warm-up to 1, then a straight line down to 0 at ``decay_steps`` (0 after it)."""
    step = max(step, 1)
    if step < warmup:
        return step / warmup
    return 1.0 - _decay_progress(step, warmup, decay_steps)


SCHEDULES: dict[str, Callable[..., float]] = {
    "inverse_sqrt": inverse_sqrt_factor,
    "cosine": cosine_factor,
    "linear": linear_factor,
}


AUTO = "auto"  # optim.decay_steps=auto: the step trainer.max_time reaches, estimated while training
NO_TIME_BUDGET = (
    "optim.decay_steps=auto ends the decay when trainer.max_time does, but trainer.max_time is not set; "
    "set it (DD:HH:MM:SS) or give optim.decay_steps as a step count"
)


@dataclass
class Schedule:
    """The learning-rate multiplier by optimizer step, for :class:`torch.optim.lr_scheduler.LambdaLR`.

    An object rather than a function so that LambdaLR stores its fields in every checkpoint: a
    ``decay_steps`` estimated during training (``auto``) survives a resume, and a resumed run continues
    the checkpoint's schedule as it continues its peak rate. Until the first estimate (``decay_steps``
    None) a decaying schedule holds the peak after its warm-up.
    """

    name: str
    warmup: int
    decay_steps: int | None = None

    def __call__(self, step: int) -> float:
        if self.name == "inverse_sqrt":
            return inverse_sqrt_factor(step, self.warmup)
        if self.decay_steps is None:  # auto, not estimated yet
            return max(step, 1) / self.warmup if step < self.warmup else 1.0
        return SCHEDULES[self.name](step, self.warmup, self.decay_steps)


def schedule_factor(schedule: str, warmup: int, decay_steps: int | str | None) -> Schedule:
    """The learning-rate multiplier by optimizer step; a clear error for an unknown or incomplete choice."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"optim.schedule={schedule!r}; valid choices: {', '.join(SCHEDULES)}")
    if schedule == "inverse_sqrt" or decay_steps == AUTO:  # no end, or an end estimated while training
        return Schedule(schedule, warmup)
    if not isinstance(decay_steps, int) or decay_steps <= warmup:
        raise ConfigError(
            f"optim.schedule={schedule} decays to zero at optim.decay_steps, which must be an integer above "
            f"optim.warmup_steps={warmup} (got {decay_steps}), e.g. trainer.max_steps, or {AUTO} with "
            "trainer.max_time"
        )
    return Schedule(schedule, warmup, decay_steps)


def configured_schedule(optim: Mapping[str, Any], max_time: Any) -> Schedule:
    """The run's schedule from the ``optim`` config, checked once before any data is prepared: a known
    name, a decay end above the warm-up, and with ``decay_steps=auto`` a ``trainer.max_time`` to end at.

    The one object is handed to the optimizer's LambdaLR and to :class:`DecayToTimeBudget`, which moves
    its end while training; LambdaLR checkpoints its fields, so a resume restores them into it.
    """
    decay_steps = optim.get("decay_steps")
    schedule = schedule_factor(optim["schedule"], optim["warmup_steps"], decay_steps)
    if decay_steps == AUTO and not max_time:
        raise ConfigError(NO_TIME_BUDGET)
    return schedule


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    schedule: Schedule,
    fused: bool = False,
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW without decay on biases and norms, driven by ``schedule`` (see the module docstring).

    ``fused`` runs the whole update as one kernel per parameter group (CPU and CUDA) instead of a few
    multi-tensor ("foreach") kernels: the same arithmetic with less memory traffic.
    """
    decay, no_decay = [], []
    for param in {id(p): p for p in model.parameters() if p.requires_grad}.values():
        (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kernel = {"fused": True} if fused else {"foreach": True}
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **kernel)
    scheduler = LambdaLR(optimizer, schedule)
    return optimizer, scheduler
