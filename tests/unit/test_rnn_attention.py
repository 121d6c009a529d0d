"""RNN attention mechanisms against float64 references written from the papers' formulas.

Bahdanau et al. 2015 (A.1.2): e_i = v^T tanh(W_s s + W_h h_i). Luong et al. 2015 (eq. 8): dot s^T h_i,
general s^T W_a h_i, concat v_a^T tanh(W_a [s; h_i]). Each mechanism's forward on padded inputs must
equal softmax over the real positions, give padding exactly zero weight, and sum to one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from app.attention import AttentionConfigError, available_mechanisms, build_mechanism, masked_softmax
from app.attention.additive import AdditiveAttention
from app.attention.luong import ConcatAttention, DotAttention, GeneralAttention
from app.attention.mechanisms import AttentionMechanism

pytestmark = pytest.mark.usefixtures("single_torch_thread")

B, S, DQ, DM = 3, 6, 8, 10
LENGTHS = [6, 4, 1]


def reference_additive(m: AdditiveAttention, s: Tensor, h: Tensor) -> Tensor:
    """e[b, i] = v^T tanh(W_s s_b + W_h h_bi), one position at a time in float64."""
    w_s, w_h, v = (p.double() for p in (m.query_proj.weight, m.key_proj.weight, m.energy.weight[0]))
    return torch.stack(
        [
            torch.stack([v @ torch.tanh(w_s @ s[b] + w_h @ h[b, i]) for i in range(h.size(1))])
            for b in range(h.size(0))
        ]
    )


def reference_dot(m: DotAttention, s: Tensor, h: Tensor) -> Tensor:
    return torch.stack([torch.stack([s[b] @ h[b, i] for i in range(h.size(1))]) for b in range(h.size(0))])


def reference_general(m: GeneralAttention, s: Tensor, h: Tensor) -> Tensor:
    w_a = m.key_proj.weight.double()
    return torch.stack(
        [torch.stack([s[b] @ (w_a @ h[b, i]) for i in range(h.size(1))]) for b in range(h.size(0))]
    )


def reference_concat(m: ConcatAttention, s: Tensor, h: Tensor) -> Tensor:
    """v_a^T tanh(W_a [s; h_i]) with W_a rebuilt as one matrix from its two halves."""
    w_a = torch.cat([m.query_proj.weight, m.key_proj.weight], dim=1).double()
    v_a = m.energy.weight[0].double()
    return torch.stack(
        [
            torch.stack([v_a @ torch.tanh(w_a @ torch.cat([s[b], h[b, i]])) for i in range(h.size(1))])
            for b in range(h.size(0))
        ]
    )


CASES: dict[str, tuple[Callable[..., Tensor], dict]] = {
    "additive": (reference_additive, {"attention_size": 7}),
    "dot": (reference_dot, {}),
    "general": (reference_general, {}),
    "concat": (reference_concat, {"attention_size": 5}),
}


def make(name: str, seed: int = 0) -> AttentionMechanism:
    torch.manual_seed(seed)
    memory_size = DQ if name == "dot" else DM
    return build_mechanism(name, query_size=DQ, memory_size=memory_size, **CASES[name][1])


def inputs(name: str, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """A query (B, DQ), padded memory (B, S, Dm) with garbage at padding, and its mask (B, S)."""
    gen = torch.Generator().manual_seed(seed)
    memory_size = DQ if name == "dot" else DM
    query = torch.randn(B, DQ, generator=gen)
    memory = torch.randn(B, S, memory_size, generator=gen) * 2
    mask = torch.arange(S)[None, :] < torch.tensor(LENGTHS)[:, None]
    memory[~mask] = 1e4  # padding must not matter, however large
    return query, memory, mask


def test_every_mechanism_has_a_reference() -> None:
    assert set(available_mechanisms()) == set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_scores_match_the_formula_in_float64(name: str) -> None:
    mechanism = make(name).double()
    query, memory, _ = (t.double() if t.is_floating_point() else t for t in inputs(name))
    memory = memory.clamp(max=3.0)  # keep padded scores finite for the score comparison
    scores = mechanism.score(query, mechanism.project_keys(memory))
    expected = CASES[name][0](mechanism, query, memory)
    torch.testing.assert_close(scores, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", CASES)
def test_weights_and_context_equal_masked_softmax_reference(name: str) -> None:
    mechanism = make(name)
    query, memory, mask = inputs(name)
    out = mechanism(query, mechanism.project_keys(memory), memory, mask)
    ref_mech = make(name).double()
    for b, length in enumerate(LENGTHS):
        real = memory[b : b + 1, :length].double()  # the sentence alone, no padding at all
        scores = CASES[name][0](ref_mech, query.double(), real.expand(B, -1, -1).clone())[b, :length]
        weights = torch.softmax(scores, dim=0)
        torch.testing.assert_close(out.weights[b, :length].double(), weights, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.context[b].double(), weights @ real[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CASES)
def test_padding_gets_exactly_zero_weight_and_rows_sum_to_one(name: str) -> None:
    mechanism = make(name)
    query, memory, mask = inputs(name)
    out = mechanism(query, mechanism.project_keys(memory), memory, mask)
    assert out.weights.shape == (B, S) and out.context.shape == (B, memory.size(-1))
    assert torch.all(out.weights[~mask] == 0.0)
    assert torch.all(out.weights[mask] > 0.0)
    torch.testing.assert_close(out.weights.sum(dim=-1), torch.ones(B))


@pytest.mark.parametrize("name", CASES)
def test_gradients_flow_to_every_parameter_and_not_through_padding(name: str) -> None:
    mechanism = make(name)
    query, memory, mask = inputs(name)
    memory = memory.clone().requires_grad_(True)
    out = mechanism(query, mechanism.project_keys(memory), memory, mask)
    out.context.square().sum().backward()
    assert torch.all(memory.grad[~mask] == 0.0)
    for pname, param in mechanism.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), pname
        assert param.grad.abs().sum() > 0, pname


def test_masked_softmax_of_a_row_without_real_positions_is_zero() -> None:
    scores = torch.randn(2, 4)
    mask = torch.tensor([[True, False, True, False], [False, False, False, False]])
    weights = masked_softmax(scores, mask)
    assert weights[0, 1] == 0 and weights[0, 3] == 0
    torch.testing.assert_close(weights[0, [0, 2]], torch.softmax(scores[0, [0, 2]], dim=0))
    assert torch.all(weights[1] == 0)


def test_unknown_mechanism_and_bad_options_name_the_valid_ones() -> None:
    with pytest.raises(AttentionConfigError, match=r"unknown RNN attention mechanism 'bilinear'.*additive, "):
        build_mechanism("bilinear", query_size=4, memory_size=4)
    with pytest.raises(AttentionConfigError, match=r"'general' rejected options \{'attention_size': 3\}"):
        build_mechanism("general", query_size=4, memory_size=4, attention_size=3)
    with pytest.raises(AttentionConfigError, match=r"decoder state 4 and encoder output 6.*luong_general"):
        build_mechanism("dot", query_size=4, memory_size=6)
