"""Translating puts a model in eval mode meanwhile and restores its root's mode; a model already in eval mode
throughout is not walked again (``TorchEngine``'s :func:`~app.inference.torch_engine.evaluating`)."""

from __future__ import annotations

import torch
from torch import nn

from app.inference.torch_engine import evaluating


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))


def test_a_training_model_is_evaluated_meanwhile_and_its_mode_restored() -> None:
    net = model().train()
    with evaluating(net):
        assert not any(m.training for m in net.modules())
    assert all(m.training for m in net.modules())


def test_a_submodule_left_training_is_evaluated_too() -> None:
    net = model().eval()
    net[2].train()  # a dropout deep inside would still draw masks
    x = torch.randn(3, 4)
    with evaluating(net):
        assert not any(m.training for m in net.modules())
        assert torch.equal(net(x), net(x))
    assert not net.training  # the root's mode: eval


def test_an_evaluated_model_is_left_alone(monkeypatch) -> None:
    net = model().eval()
    calls = []
    monkeypatch.setattr(nn.Module, "train", lambda self, mode=True: calls.append(mode) or self)
    with evaluating(net):
        pass
    assert calls == []
