"""The learning-rate schedule chosen in the config is the one a real training run follows, step by step."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.training import compose_train, logged_column, read_trace, tiny_overrides

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


@pytest.mark.slow
def test_decay_steps_auto_reaches_zero_when_the_time_budget_ends(corpus_slice: Path, tmp_path: Path) -> None:
    trace, run_dir = tmp_path / "trace.jsonl", tmp_path / "run"
    overrides = tiny_overrides(
        corpus_slice,
        run_dir,
        tmp_path / "cache",
        f"optim.lr={PEAK}",
        f"optim.warmup_steps={WARMUP}",
        "optim.schedule=cosine",
        "optim.decay_steps=auto",
        "trainer.max_time=00:00:00:12",
        "trainer.max_epochs=10000",
        "trainer.limit_val_batches=0",
        "early_stopping.patience=0",
        f"debug.trace_batches={trace}",
    )
    train(compose_train(overrides))

    records = read_trace(trace)
    last_step = records[-1]["step"]
    estimates = logged_column(run_dir / "csv" / "metrics.csv", "optim/decay_steps")
    assert len(estimates) >= 3, f"{last_step} steps in 12 s gave {len(estimates)} estimates"
    # the decay's end is where the budget ended: within 10%, or 5 steps where a busy machine ran few
    assert abs(estimates[-1] - last_step) <= max(0.1 * last_step, 5)
    assert max(r["lr"] for r in records) == pytest.approx(PEAK)
    assert records[-1]["lr"] < 0.05 * PEAK  # so the last updates were the small ones


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["optim.schedule=cosine"], r"optim.schedule=cosine .* optim.decay_steps"),
        (["optim.schedule=linear", "optim.decay_steps=auto"], r"trainer.max_time is not set"),
    ],
)
def test_a_schedule_that_cannot_end_fails_before_training(
    extra: list[str], message: str, corpus_slice: Path, tmp_path: Path
) -> None:
    overrides = tiny_overrides(corpus_slice, tmp_path / "run", tmp_path / "cache", *extra)
    with pytest.raises(ValueError, match=message):
        train(compose_train(overrides))
    assert not (tmp_path / "run" / "checkpoints").exists()
