"""The CPU dropout built from 64-bit random words (app/models/dropout.py): its rate, its independence,
its exact output and gradient, and its reproducibility under a seed (what exact resume relies on)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from app.models.dropout import Dropout, dropout, keep_mask

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_the_mask_drops_a_fraction_p_within_sampling_error(p: float) -> None:
    torch.manual_seed(0)
    count = 1 << 20
    dropped = 1.0 - keep_mask(torch.Size([count]), p).double().mean().item()
    sigma = (p * (1 - p) / count) ** 0.5
    assert abs(dropped - p) < 5 * sigma


def test_neighbouring_elements_are_uncorrelated() -> None:
    """Four mask elements come from one 64-bit word: their slices must not agree more than chance."""
    torch.manual_seed(1)
    keep = keep_mask(torch.Size([1 << 20]), 0.5).double()
    centred = keep - keep.mean()
    for lag in (1, 2, 3, 4, 5):
        correlation = (centred[:-lag] * centred[lag:]).mean() / centred.var()
        assert abs(correlation.item()) < 5 / (1 << 10)  # 5 sigma for 2^20 samples


def test_the_mask_has_the_input_shape_for_sizes_not_divisible_by_four() -> None:
    mask = keep_mask(torch.Size([3, 5, 7]), 0.3)
    assert mask.shape == (3, 5, 7) and mask.dtype == torch.bool


def test_output_is_the_input_masked_and_scaled_and_the_gradient_follows() -> None:
    x = torch.randn(4, 9, 6, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    out = dropout(x, 0.3, training=True)
    torch.manual_seed(5)
    keep = keep_mask(x.shape, 0.3)
    torch.testing.assert_close(out, x.detach() * keep / 0.7, rtol=0, atol=1e-15)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    torch.testing.assert_close(x.grad, upstream * keep / 0.7, rtol=0, atol=1e-15)


def test_bfloat16_keeps_its_dtype_and_the_expected_value() -> None:
    torch.manual_seed(2)
    x = torch.ones(1 << 18, dtype=torch.bfloat16)
    out = dropout(x, 0.3, training=True)
    assert out.dtype == torch.bfloat16
    assert out.double().mean().item() == pytest.approx(1.0, abs=0.01)  # inverted dropout keeps the mean


def test_the_same_seed_gives_the_same_mask_and_another_seed_another() -> None:
    x = torch.ones(64, 64)
    masks = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        masks.append(dropout(x, 0.5, training=True))
    assert torch.equal(masks[0], masks[1])
    assert not torch.equal(masks[0], masks[2])


def test_evaluation_and_zero_rate_return_the_input_itself() -> None:
    x = torch.randn(3, 4)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))


def test_the_module_is_a_drop_in_for_nn_dropout() -> None:
    layer = Dropout(0.25)
    assert isinstance(layer, nn.Dropout) and layer.p == 0.25
    assert layer.state_dict() == {} and repr(layer) == repr(nn.Dropout(0.25))
    x = torch.randn(5, 8)
    assert layer.eval()(x) is x
    assert (layer.train()(x) == 0).any()
