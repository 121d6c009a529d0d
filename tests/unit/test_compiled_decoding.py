"""The wrapper of :mod:`app.acceleration.decoding`: a model wrapped from outside, the model itself untouched,
every mode's choice and its reasons, ensembles member by member, and the model's own code wherever a
compiled path must not run (training, gradients). None of these tests compiles anything."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers.batches import random_sources
from helpers.decoding import BOS, VOCAB

from app.acceleration.decoding import CompiledDecoding, CompileReport, accelerate
from app.acceleration.step import compile_available
from app.models import Transformer
from app.models.ensemble import Ensemble

pytestmark = pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler")


def test_a_model_is_wrapped_from_outside(make_transformer: Callable[..., Transformer]) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    fast, reason = accelerate(model)
    assert reason is None and isinstance(fast, CompiledDecoding) and fast.model is model
    assert not fast.training  # the model's mode: search does not switch it
    assert set(vars(model)) == set(vars(make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)))
    assert not any(isinstance(m, CompiledDecoding) for m in model.modules())  # wrapped from outside only
    rnn = torch.nn.GRU(2, 2)
    assert accelerate(rnn)[1] == "GRU has no Transformer decoder"


def test_an_ensemble_is_wrapped_member_by_member(make_transformer: Callable[..., Transformer]) -> None:
    members = [make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=s) for s in (1, 2)]
    ensemble = Ensemble(members).eval()
    fast, reason = accelerate(ensemble)
    assert reason is None and isinstance(fast, Ensemble) and fast is not ensemble
    assert [m.model for m in fast.members] == members  # the same parameters, wrapped
    assert not any(isinstance(m, CompiledDecoding) for m in ensemble.modules())


def test_training_and_gradients_run_the_models_own_code(make_transformer: Callable[..., Transformer]) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    fast, _ = accelerate(model)
    src = random_sources(2, 3, 5, vocab=VOCAB)
    state = fast.start_decoding(fast.encode(src))  # gradients on: the model's encoder
    fast.decode_step(torch.full((2,), BOS), state)
    with torch.no_grad():
        model.train()
        fast.decode_step(torch.full((2,), BOS), fast.start_decoding(fast.encode(src)))
        model.eval()
    assert CompileReport.of(fast) == CompileReport()  # nothing was packaged
    assert not fast.start.runners and not fast.steps.runners
