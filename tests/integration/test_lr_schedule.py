"""The learning-rate schedule chosen in the config is the one a real training run follows, step by step."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.training import compose_train, read_trace, tiny_overrides

from app.training.optim import schedule_factor
from app.training.task import train

PEAK, WARMUP, DECAY_STEPS, STEPS = 3e-3, 2, 6, 8


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_training_follows_the_configured_schedule_to_zero(
    schedule: str, corpus_slice: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    overrides = tiny_overrides(
        corpus_slice,
        tmp_path / "run",
        tmp_path / "cache",
        f"optim.lr={PEAK}",
        f"optim.warmup_steps={WARMUP}",
        f"optim.schedule={schedule}",
        f"optim.decay_steps={DECAY_STEPS}",
        f"trainer.max_steps={STEPS}",
        "trainer.limit_val_batches=0",
        "early_stopping.patience=0",
        f"debug.trace_batches={trace}",
    )
    train(compose_train(overrides))

    factor = schedule_factor(schedule, WARMUP, DECAY_STEPS)
    records = read_trace(trace)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    # the rate each record shows is the one the next update uses: after `step` scheduler steps
    assert [r["lr"] for r in records] == pytest.approx([PEAK * factor(r["step"]) for r in records])
    assert records[WARMUP - 1]["lr"] == pytest.approx(PEAK) and records[-1]["lr"] == 0.0


def test_a_schedule_that_cannot_end_fails_before_training(corpus_slice: Path, tmp_path: Path) -> None:
    overrides = tiny_overrides(corpus_slice, tmp_path / "run", tmp_path / "cache", "optim.schedule=cosine")
    with pytest.raises(ValueError, match=r"optim.schedule=cosine .* optim.decay_steps"):
        train(compose_train(overrides))
    assert not (tmp_path / "run" / "checkpoints").exists()
