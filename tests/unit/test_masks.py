"""Tests for app.attention.masks: True = may attend, queries aligned to the end of the keys."""

from __future__ import annotations

import pytest
import torch

from app.attention import attention_mask, causal_mask, padding_mask

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_padding_mask_marks_real_tokens() -> None:
    tokens = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]])
    expected = torch.tensor([[True, True, True, False], [True, False, False, False]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)
    assert torch.equal(padding_mask(tokens, pad_id=8), tokens != 8)


def test_causal_mask_square_is_lower_triangular() -> None:
    expected = torch.tensor(
        [
            [True, False, False, False],
            [True, True, False, False],
            [True, True, True, False],
            [True, True, True, True],
        ]
    )
    assert torch.equal(causal_mask(4, 4), expected)


def test_causal_mask_queries_align_to_the_end_of_the_keys() -> None:
    # Two queries over five keys: they sit at absolute positions 3 and 4.
    expected = torch.tensor([[True, True, True, True, False], [True, True, True, True, True]])
    assert torch.equal(causal_mask(2, 5), expected)
    # One query (incremental decoding) sees every cached key.
    assert torch.equal(causal_mask(1, 6), torch.ones(1, 6, dtype=torch.bool))


@pytest.mark.parametrize(("tq", "tk"), [(1, 1), (3, 3), (2, 7), (5, 6), (4, 2)])
def test_causal_mask_matches_definition(tq: int, tk: int) -> None:
    mask = causal_mask(tq, tk)
    assert mask.shape == (tq, tk)
    for i in range(tq):
        for j in range(tk):
            assert bool(mask[i, j]) == (j <= i + tk - tq), (i, j)


def test_attention_mask_none_without_constraints() -> None:
    assert attention_mask(None, causal=False, tq=3, tk=4) is None


def test_attention_mask_key_padding_only() -> None:
    key_mask = torch.tensor([[True, True, False], [True, False, False]])
    mask = attention_mask(key_mask, causal=False, tq=2, tk=3)
    assert mask.shape == (2, 1, 1, 3)
    assert torch.equal(mask.expand(2, 1, 2, 3), key_mask[:, None, None, :].expand(2, 1, 2, 3))


def test_attention_mask_causal_only() -> None:
    mask = attention_mask(None, causal=True, tq=2, tk=4)
    assert mask.shape == (1, 1, 2, 4)
    assert torch.equal(mask[0, 0], causal_mask(2, 4))


def test_attention_mask_combines_padding_and_causal() -> None:
    key_mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    mask = attention_mask(key_mask, causal=True, tq=3, tk=4)
    assert mask.shape == (2, 1, 3, 4)
    for b in range(2):
        for i in range(3):
            for j in range(4):
                visible = bool(key_mask[b, j]) and j <= i + 1
                assert bool(mask[b, 0, i, j]) == visible, (b, i, j)
