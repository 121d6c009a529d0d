"""The output layer fused with the label-smoothed loss (``linear_smoothed_nll``), and the models'
``output_features``: the same loss and gradients as the logits path, in any number of row blocks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers.rnn import tiny_rnn
from torch import Tensor, nn

from app.models import Transformer
from app.training.losses import (
    _LinearSmoothedCrossEntropy,
    _SmoothedCrossEntropy,
    label_smoothed_nll,
    linear_smoothed_nll,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PAD = 0


def states_layer_targets(bias: bool, dtype: torch.dtype = torch.float64) -> tuple[Tensor, nn.Linear, Tensor]:
    """States (3, 6, 8), an output layer 8 -> 11, targets (3, 6) with padding."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 6, 8, generator=gen, dtype=dtype) * 2
    layer = nn.Linear(8, 11, bias=bias).to(dtype)
    target = torch.randint(1, 11, (3, 6), generator=gen)
    target[1, 4:] = PAD
    target[2, 1:] = PAD
    return hidden, layer, target


def loss_and_grads(loss_fn, hidden: Tensor, layer: nn.Linear, target: Tensor) -> list[Tensor]:
    """[loss, nll, d/d hidden, d/d weight(, d/d bias)] for an upstream gradient of 2.5."""
    hidden = hidden.clone().requires_grad_()
    layer.zero_grad()
    loss, nll = loss_fn(hidden, layer, target)
    (2.5 * loss).backward()
    grads = [hidden.grad, layer.weight.grad] + ([layer.bias.grad] if layer.bias is not None else [])
    return [loss.detach(), nll.detach(), *[g.clone() for g in grads]]


def fused(hidden: Tensor, layer: nn.Linear, target: Tensor) -> tuple[Tensor, Tensor]:
    return linear_smoothed_nll(hidden, layer, target, epsilon=0.1, pad_id=PAD)


def unfused(hidden: Tensor, layer: nn.Linear, target: Tensor) -> tuple[Tensor, Tensor]:
    return label_smoothed_nll(layer(hidden), target, epsilon=0.1, pad_id=PAD)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("block_floats", [11, 50, 1 << 20])  # one row per block, several, all rows at once
def test_fused_equals_the_logits_path_in_float64(
    bias: bool, block_floats: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_LinearSmoothedCrossEntropy, "CACHE_FLOATS", block_floats)
    hidden, layer, target = states_layer_targets(bias)
    for ours, reference in zip(
        loss_and_grads(fused, hidden, layer, target),
        loss_and_grads(unfused, hidden, layer, target),
        strict=True,
    ):
        torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)


def test_fused_without_gradients_gives_the_same_values() -> None:
    hidden, layer, target = states_layer_targets(bias=True)
    with torch.no_grad():
        values = fused(hidden, layer, target)
    reference = unfused(hidden, layer, target)
    for ours, expected in zip(values, reference, strict=True):
        torch.testing.assert_close(ours, expected.detach(), rtol=1e-12, atol=1e-12)


def test_fused_under_bf16_autocast_matches_the_logits_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Matrix products in bf16 as nn.Linear's under autocast, softmax in float32, float32 gradients."""
    monkeypatch.setattr(_LinearSmoothedCrossEntropy, "CACHE_FLOATS", 40)  # several blocks
    hidden, layer, target = states_layer_targets(bias=False, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = loss_and_grads(fused, hidden, layer, target)
        reference = loss_and_grads(unfused, hidden, layer, target)
    assert ours[0].dtype == torch.float32 and ours[2].dtype == torch.float32
    for got, expected in zip(ours, reference, strict=True):  # bf16 rounding apart, in norm
        assert ((got - expected).norm() / expected.norm()).item() < 1e-2


def test_blocked_smoothed_loss_of_bf16_logits_equals_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logits narrower than float32 are cast a block at a time; the block size changes nothing."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(9, 13, generator=gen) * 3).to(torch.bfloat16)
    target = torch.randint(1, 13, (9,), generator=gen)
    target[::4] = PAD
    results = []
    for block_floats in (13, 40, 1 << 20):
        monkeypatch.setattr(_SmoothedCrossEntropy, "CACHE_FLOATS", block_floats)
        leaf = logits.clone().requires_grad_()
        loss, nll = label_smoothed_nll(leaf, target, epsilon=0.1, pad_id=PAD)
        loss.backward()
        assert leaf.grad.dtype == torch.bfloat16
        results.append((loss.detach(), nll, leaf.grad))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["transformer", "rnn"])
def test_output_features_give_forward_and_the_same_training_gradients(
    name: str, make_transformer: Callable[..., Transformer]
) -> None:
    model = (make_transformer() if name == "transformer" else tiny_rnn("luong_general")).double()
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 7), generator=gen)
    tgt = torch.randint(4, 40, (3, 6), generator=gen)
    src[2, 4:] = PAD
    tgt[1, 3:] = PAD
    features, layer = model.output_features(src, tgt)
    torch.testing.assert_close(layer(features), model(src, tgt), rtol=0, atol=0)

    def gradients(loss_fn) -> list[Tensor]:
        model.zero_grad()
        loss, _ = loss_fn()
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    ours = gradients(
        lambda: linear_smoothed_nll(*model.output_features(src, tgt), tgt, epsilon=0.1, pad_id=PAD)
    )
    reference = gradients(lambda: label_smoothed_nll(model(src, tgt), tgt, epsilon=0.1, pad_id=PAD))
    assert len(ours) == len(reference) > 0
    for got, expected in zip(ours, reference, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
