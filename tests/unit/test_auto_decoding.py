"""``--compile auto`` (app.acceleration.auto): eager while the packages would not pay for themselves on what
is being decoded, packages once they would, every member of an ensemble counted; built packages (noted in
the cache) cost a load, the others a build. Nothing here compiles: the decisions are made from the seconds
recorded, as the translator records them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.decoding import VOCAB

from app.acceleration.auto import (
    BUILD_SECONDS,
    GAIN_ROWS,
    LOAD_SECONDS,
    AutoDecoding,
    FixedDecoding,
    decoding_for,
)
from app.acceleration.decoding import CompiledDecoding
from app.acceleration.step import compile_available
from app.models import Transformer
from app.models.ensemble import Ensemble

pytestmark = pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler")


@pytest.fixture
def auto(make_transformer: Callable[..., Transformer], tmp_path: Path, monkeypatch) -> AutoDecoding:
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(tmp_path / "packages"))
    decoding = decoding_for(make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB), "auto")
    assert isinstance(decoding, AutoDecoding)
    return decoding


def test_one_batch_or_a_short_input_stays_eager(auto: AutoDecoding) -> None:
    assert auto.model_for(left=1, sentences=1, beam=1) is auto.model  # nothing measured yet: eager
    auto.record(auto.model, sentences=1, seconds=0.05)
    assert auto.model_for(left=100, sentences=1, beam=1) is auto.model  # 37% of 5 s < 3 builds
    assert auto.report().startswith("compile=auto: decoded eagerly, 1 sentence: 37% of ~5.0 s")


def test_it_switches_once_the_saving_passes_the_packages_cost(
    auto: AutoDecoding, caplog: pytest.LogCaptureFixture
) -> None:
    auto.record(auto.model, sentences=64, seconds=1.0)
    cost = 4 * BUILD_SECONDS  # encoder, first step, the steps of several sentences and of the last one
    left = int(cost / GAIN_ROWS / (1.0 / 64)) + 64  # a saving of 14% of what is left passes the cost
    assert auto.model_for(left=64, sentences=64, beam=5) is auto.model
    with caplog.at_level(logging.INFO, logger="app.acceleration.auto"):
        assert auto.model_for(left=left, sentences=64, beam=5) is auto.packaged
        assert auto.model_for(left=1, sentences=1, beam=1) is auto.packaged  # and stays
    assert len(caplog.records) == 1 and "switching to ahead-of-time packages" in caplog.text
    assert auto.report().startswith("compile=auto: ahead-of-time packages")


def test_packages_built_before_cost_a_load(auto: AutoDecoding) -> None:
    (wrapper,) = auto.wrappers()
    assert auto.one_time_cost(1, 1) == 3 * BUILD_SECONDS
    for name in ("encoder_1", "first_step_1", "step_1x1x1"):
        wrapper.packager.store.note(wrapper.packager.model_id, name)
    assert auto.one_time_cost(1, 1) == 3 * LOAD_SECONDS
    assert auto.one_time_cost(4, 1) == 4 * BUILD_SECONDS - BUILD_SECONDS + LOAD_SECONDS  # step_1x1x1 built


def test_an_ensemble_counts_every_members_packages(make_transformer: Callable[..., Transformer]) -> None:
    members = [make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, seed=s) for s in (1, 2)]
    auto = decoding_for(Ensemble(members).eval(), "auto")
    assert isinstance(auto, AutoDecoding) and len(auto.wrappers()) == 2
    assert auto.one_time_cost(1, 1) == 2 * 3 * BUILD_SECONDS


def test_off_and_aot_are_fixed_and_another_mode_names_the_valid_ones(
    make_transformer: Callable[..., Transformer],
) -> None:
    model = make_transformer(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB)
    with pytest.raises(ValueError, match="compile='on' is not one of auto, aot, off"):
        decoding_for(model, "on")
    off, aot = decoding_for(model, "off"), decoding_for(model, "aot")
    assert isinstance(off, FixedDecoding) and off.model_for(1, 1, 1) is model and off.report() is None
    assert isinstance(aot.model_for(1, 1, 1), CompiledDecoding)
    assert aot.report() == "decoding compiled ahead of time: 0 package(s) in 0.0 s"
