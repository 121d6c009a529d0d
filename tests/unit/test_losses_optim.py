"""Tests for app.training.losses (label smoothing, R-Drop's KL) and app.training.optim (groups, schedule)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from app.models import Transformer
from app.training.callbacks import steps_within_budget
from app.training.losses import _SymmetricKL, label_smoothed_nll, symmetric_kl
from app.training.optim import (
    AUTO,
    SCHEDULES,
    Schedule,
    build_optimizer,
    cosine_factor,
    inverse_sqrt_factor,
    linear_factor,
    schedule_factor,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD = 0


def random_logits_and_targets(dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=gen, dtype=dtype) * 3
    target = torch.randint(1, 7, (3, 5), generator=gen)
    target[1, 3:] = PAD
    target[2, 1:] = PAD
    return logits, target


def hand_written_loss(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """sum over real targets of (1 - eps) * (-log p[y]) + eps * mean_v(-log p[v]), and the plain NLL sum."""
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    loss, nll = log_probs.new_zeros(()), log_probs.new_zeros(())
    for b in range(target.size(0)):
        for t in range(target.size(1)):
            y = int(target[b, t])
            if y == PAD:
                continue
            token_nll = -log_probs[b, t, y]
            loss = loss + (1 - epsilon) * token_nll + epsilon * (-log_probs[b, t]).mean()
            nll = nll + token_nll
    return loss, nll


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothed_nll_matches_the_formula(epsilon: float) -> None:
    logits, target = random_logits_and_targets()
    loss, nll = label_smoothed_nll(logits, target, epsilon=epsilon, pad_id=PAD)
    expected_loss, expected_nll = hand_written_loss(logits, target, epsilon)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5)
    assert nll.item() == pytest.approx(expected_nll.item(), rel=1e-5)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_label_smoothed_nll_gradient_matches_the_formula(epsilon: float) -> None:
    logits, target = random_logits_and_targets()
    ours = logits.clone().requires_grad_()
    reference = logits.clone().requires_grad_()
    loss, _ = label_smoothed_nll(ours, target, epsilon=epsilon, pad_id=PAD)
    (2.5 * loss).backward()  # a non-unit upstream gradient must scale the result
    expected, _ = hand_written_loss(reference, target, epsilon)
    (2.5 * expected).backward()
    torch.testing.assert_close(ours.grad.double(), reference.grad, rtol=1e-4, atol=1e-6)
    assert torch.all(ours.grad[target == PAD] == 0)  # padding contributes nothing


def test_zero_smoothing_is_plain_nll() -> None:
    logits, target = random_logits_and_targets()
    loss, nll = label_smoothed_nll(logits, target, epsilon=0.0, pad_id=PAD)
    plain = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 7), target.reshape(-1), ignore_index=PAD, reduction="sum"
    )
    assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
    assert nll.item() == pytest.approx(plain.item(), rel=1e-6)


def test_padding_is_ignored_whatever_the_logits() -> None:
    logits, target = random_logits_and_targets()
    changed = logits.clone()
    changed[target == PAD] = torch.randn_like(changed[target == PAD]) * 10
    for epsilon in (0.0, 0.1):
        before = label_smoothed_nll(logits, target, epsilon=epsilon, pad_id=PAD)
        after = label_smoothed_nll(changed, target, epsilon=epsilon, pad_id=PAD)
        assert [t.item() for t in after] == pytest.approx([t.item() for t in before], rel=1e-6)


def test_low_precision_logits_give_a_float32_loss_and_matching_gradients() -> None:
    logits, target = random_logits_and_targets(torch.float32)
    half = logits.to(torch.bfloat16).requires_grad_()
    full = half.detach().float().requires_grad_()
    loss_half, _ = label_smoothed_nll(half, target, epsilon=0.1, pad_id=PAD)
    loss_full, _ = label_smoothed_nll(full, target, epsilon=0.1, pad_id=PAD)
    assert loss_half.dtype == torch.float32
    assert loss_half.item() == pytest.approx(loss_full.item(), rel=1e-5)
    loss_half.backward()
    loss_full.backward()
    assert half.grad.dtype == torch.bfloat16
    torch.testing.assert_close(half.grad.float(), full.grad, rtol=1e-2, atol=1e-2)


def hand_written_symmetric_kl(logits_a: Tensor, logits_b: Tensor, target: Tensor) -> Tensor:
    """KL(p_a || p_b) + KL(p_b || p_a) summed over real targets, one term at a time."""
    log_a, log_b = torch.log_softmax(logits_a.double(), -1), torch.log_softmax(logits_b.double(), -1)
    total = log_a.new_zeros(())
    for b in range(target.size(0)):
        for t in range(target.size(1)):
            if int(target[b, t]) == PAD:
                continue
            pa, pb = log_a[b, t].exp(), log_b[b, t].exp()
            total = (
                total + (pa * (log_a[b, t] - log_b[b, t])).sum() + (pb * (log_b[b, t] - log_a[b, t])).sum()
            )
    return total


@pytest.mark.parametrize("block_floats", [1 << 18, 14])  # all 15 rows in one block, or 2 rows per block
def test_symmetric_kl_matches_the_formula_and_its_gradient(
    block_floats: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_SymmetricKL, "CACHE_FLOATS", block_floats)
    logits_a, target = random_logits_and_targets()
    logits_b = logits_a + torch.randn(
        logits_a.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    inputs = [logits_a.clone().requires_grad_(), logits_b.clone().requires_grad_()]
    references = [logits_a.clone().requires_grad_(), logits_b.clone().requires_grad_()]
    value = symmetric_kl(*inputs, target, pad_id=PAD)
    expected = hand_written_symmetric_kl(*references, target)
    assert value.item() == pytest.approx(expected.item(), rel=1e-10)
    assert value.item() > 0.1
    value.backward()
    expected.backward()
    for got, want in zip(inputs, references, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_symmetric_kl_is_zero_for_equal_predictions_and_ignores_padding() -> None:
    logits, target = random_logits_and_targets()
    assert symmetric_kl(logits, logits.clone(), target, pad_id=PAD).item() == 0.0
    other = logits.clone()
    other[target == PAD] = torch.randn(int((target == PAD).sum()), logits.size(-1), dtype=logits.dtype) * 5
    assert symmetric_kl(logits, other, target, pad_id=PAD).item() == 0.0


def test_inverse_sqrt_factor_warmup_then_decay() -> None:
    warmup = 4
    assert [inverse_sqrt_factor(s, warmup) for s in range(5)] == pytest.approx([0.25, 0.25, 0.5, 0.75, 1.0])
    assert inverse_sqrt_factor(16, warmup) == pytest.approx(0.5)
    assert inverse_sqrt_factor(400, warmup) == pytest.approx(0.1)
    assert inverse_sqrt_factor(1, 1) == 1.0


def test_cosine_and_linear_warm_up_then_reach_zero_at_decay_steps() -> None:
    warmup, end = 4, 12
    for factor in (cosine_factor, linear_factor):
        assert [factor(s, warmup, end) for s in range(5)] == pytest.approx([0.25, 0.25, 0.5, 0.75, 1.0])
        assert factor(8, warmup, end) == pytest.approx(0.5)  # halfway through the decay, for both shapes
        assert factor(end, warmup, end) == 0.0 and factor(end + 100, warmup, end) == 0.0
        decay = [factor(s, warmup, end) for s in range(warmup, end + 1)]
        assert decay == sorted(decay, reverse=True)
    assert cosine_factor(6, warmup, end) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert linear_factor(6, warmup, end) == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("schedule", "decay_steps", "message"),
    [
        ("cosin", 100, "valid choices: inverse_sqrt, cosine, linear"),
        ("cosine", None, "optim.decay_steps"),
        ("linear", 4, "above optim.warmup_steps=4"),
        ("cosine", "8000", "or auto with trainer.max_time"),
    ],
)
def test_schedule_errors_name_the_key_and_the_choices(
    schedule: str, decay_steps: int | str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        schedule_factor(schedule, 4, decay_steps)


def optimizer_and_scheduler(
    model: torch.nn.Module, **schedule: Any
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW at a peak of 2e-3 after 3 warm-up steps, with the given schedule."""
    return build_optimizer(
        model,
        lr=2e-3,
        weight_decay=0.0,
        betas=(0.9, 0.98),
        eps=1e-9,
        schedule=schedule_factor(schedule["schedule"], 3, schedule["decay_steps"]),
    )


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_scheduler_follows_the_chosen_factor(
    schedule: str, make_transformer: Callable[..., Transformer]
) -> None:
    optimizer, scheduler = optimizer_and_scheduler(make_transformer(), schedule=schedule, decay_steps=9)
    seen = []
    for _ in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([2e-3 * schedule_factor(schedule, 3, 9)(s) for s in range(12)])


def test_auto_decay_holds_the_peak_until_estimated_then_follows_the_estimate(
    make_transformer: Callable[..., Transformer],
) -> None:
    _, scheduler = optimizer_and_scheduler(make_transformer(), schedule="cosine", decay_steps=AUTO)
    schedule = scheduler.lr_lambdas[0]
    assert all(fn is schedule for fn in scheduler.lr_lambdas)  # one object for both parameter groups
    assert [schedule(s) for s in range(6)] == pytest.approx([1 / 3, 1 / 3, 2 / 3, 1.0, 1.0, 1.0])
    schedule.decay_steps = 9  # what DecayToTimeBudget does while training
    assert [schedule(s) for s in range(12)] == pytest.approx([cosine_factor(s, 3, 9) for s in range(12)])


def test_an_estimated_decay_end_is_checkpointed_with_the_scheduler(
    make_transformer: Callable[..., Transformer],
) -> None:
    model = make_transformer()
    optimizer, scheduler = optimizer_and_scheduler(model, schedule="linear", decay_steps=AUTO)
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    scheduler.lr_lambdas[0].decay_steps = 8
    state = scheduler.state_dict()

    resumed_optimizer, resumed = optimizer_and_scheduler(model, schedule="linear", decay_steps=AUTO)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(state)
    assert resumed.lr_lambdas[0].decay_steps == 8
    for scheduler_ in (scheduler, resumed):
        scheduler_.optimizer.step()
        scheduler_.step()
    assert resumed.get_last_lr() == pytest.approx(scheduler.get_last_lr())
    assert resumed.get_last_lr()[0] == pytest.approx(2e-3 * linear_factor(6, 3, 8))


def test_steps_within_budget_extrapolates_the_rate_and_never_goes_back() -> None:
    assert steps_within_budget(100, steps_per_s=2.5, remaining_s=40.0) == 200
    assert steps_within_budget(100, steps_per_s=2.5, remaining_s=0.3) == 100
    assert steps_within_budget(100, steps_per_s=2.5, remaining_s=-5.0) == 100  # the budget has run out


def test_scheduler_follows_the_factor(make_transformer: Callable[..., Transformer]) -> None:
    model = make_transformer()
    optimizer, scheduler = build_optimizer(
        model, lr=2e-3, weight_decay=0.0, betas=(0.9, 0.98), eps=1e-9, schedule=Schedule("inverse_sqrt", 4)
    )
    seen = []
    for _ in range(8):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([2e-3 * inverse_sqrt_factor(s, 4) for s in range(8)])
    assert optimizer.param_groups[0]["lr"] == optimizer.param_groups[1]["lr"]


def test_optimizer_groups_exclude_biases_and_norms_from_decay(
    make_transformer: Callable[..., Transformer],
) -> None:
    model = make_transformer(tie_embeddings=True, share_src_tgt_embeddings=True)
    model.encoder[0].ffn[0].bias.requires_grad_(False)  # frozen parameters are left out
    optimizer, _ = build_optimizer(
        model, lr=1e-3, weight_decay=0.01, betas=(0.9, 0.98), eps=1e-9, schedule=Schedule("inverse_sqrt", 10)
    )
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    decay_ids = {id(p) for p in decay["params"]}
    no_decay_ids = {id(p) for p in no_decay["params"]}
    assert len(decay_ids) == len(decay["params"]) and len(no_decay_ids) == len(no_decay["params"])

    names = dict(model.named_parameters(remove_duplicate=False))
    for name, param in names.items():
        if not param.requires_grad:
            assert id(param) not in decay_ids | no_decay_ids, name
        elif name.endswith(".bias") or "norm" in name:
            assert id(param) in no_decay_ids, name
        else:
            assert id(param) in decay_ids, name
    # The three tied matrices (source, target embeddings, output projection) are one parameter.
    tied = {"src_embed.weight", "tgt_embed.weight", "output.weight"}
    assert len({id(names[n]) for n in tied}) == 1
    unique = {id(p) for p in model.parameters() if p.requires_grad}
    assert decay_ids | no_decay_ids == unique
    assert len(decay["params"]) + len(no_decay["params"]) == len(unique)
