"""``train/tokens_per_s`` is the rate of the training steps: a validation's time (at long inputs, an
untrained model decoding to the length limit) is left out of the logged interval."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from app.data.tokenizer import Tokenizer
from app.training import module as module_file
from app.training.module import TranslationModule


def test_the_logged_rate_leaves_validation_out(
    spm_tokenizer: Tokenizer,
    make_transformer: Callable[..., torch.nn.Module],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = make_transformer(
        src_vocab_size=spm_tokenizer.vocab_size,
        tgt_vocab_size=spm_tokenizer.vocab_size,
        pad_id=spm_tokenizer.pad_id,
    )
    tokenizers = {"src_tokenizer": spm_tokenizer, "tgt_tokenizer": spm_tokenizer}
    module = TranslationModule(model=model, config={}, **tokenizers)
    now = [100.0]  # seconds on a clock the test moves
    monkeypatch.setattr(module_file.time, "perf_counter", lambda: now[0])
    logged: dict[str, float] = {}
    monkeypatch.setattr(module, "log", lambda name, value, **kwargs: logged.__setitem__(name, value))
    trainer = SimpleNamespace(  # a step whose metrics Lightning writes
        _logger_connector=SimpleNamespace(should_update_logs=True),
        fit_loop=SimpleNamespace(_should_accumulate=lambda: False),
    )
    monkeypatch.setattr(TranslationModule, "trainer", trainer)

    now[0] = 130.0  # set-up and the sanity check's validation took 30 s: not training
    module.on_train_start()
    now[0] = 132.0
    module._tokens_seen = 1000  # two seconds of steps
    module.on_validation_start()
    now[0] = 140.0  # an eight-second validation
    module.on_validation_end()
    now[0] = 142.0  # two more seconds of steps
    module._tokens_seen += 1000
    module.on_train_batch_end(None, None, batch_idx=0)
    assert logged["train/tokens_per_s"] == pytest.approx(2000 / 4)  # not 2000 / 12, nor / 42
