"""R-Drop (``optim.rdrop_alpha``) in real runs: the paper's loss, and without dropout no change at all."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.training import compose_train, tiny_overrides

from app.bench.runs import StepClock
from app.data.batch import Batch
from app.models.flops import batch_lengths, transformer_training_flops
from app.training.losses import label_smoothed_nll
from app.training.task import Fit, build_fit


def tiny_run(corpus: Path, out: Path, *extra: str) -> Fit:
    overrides = tiny_overrides(corpus, out / "run", out / "cache", "early_stopping.patience=0", *extra)
    return build_fit(compose_train(overrides))


def first_training_batch(run: Fit) -> Batch:
    run.datamodule.setup("fit")
    return next(iter(run.datamodule.train_dataloader()))


def test_rdrop_loss_is_the_papers_formula_under_the_same_dropout_masks(
    corpus_slice: Path, tmp_path: Path
) -> None:
    """(CE_1 + CE_2 + alpha/2 (KL_12 + KL_21)) / 2, the two passes under the module's dropout masks."""
    run = tiny_run(corpus_slice, tmp_path, "optim.rdrop_alpha=5", "model.dropout=0.3")
    module, batch = run.module.train(), first_training_batch(run)
    assert module.rdrop_alpha == 5.0
    torch.manual_seed(7)
    loss, nll, tokens = module._rdrop_losses(batch)

    torch.manual_seed(7)  # the same dropout masks: one pass over the batch stacked twice
    logits = module.model(torch.cat([batch.src, batch.src]), torch.cat([batch.tgt_in, batch.tgt_in]))
    first, second = logits.double().chunk(2)
    keep = batch.tgt_out.ne(batch.pad_id)
    cross_entropy, plain = zip(
        *(label_smoothed_nll(x, batch.tgt_out, epsilon=0.1, pad_id=batch.pad_id) for x in (first, second)),
        strict=True,
    )
    log_p, log_q = torch.log_softmax(first, -1), torch.log_softmax(second, -1)
    kl_pq = (log_p.exp() * (log_p - log_q)).sum(-1)[keep].sum()
    kl_qp = (log_q.exp() * (log_q - log_p)).sum(-1)[keep].sum()
    expected = (sum(cross_entropy) + 5 / 2 * (kl_pq + kl_qp)) / 2

    assert tokens == batch.num_target_tokens
    assert (kl_pq + kl_qp).item() > 1e-3  # dropout made the passes differ: the KL term is really there
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert nll.item() == pytest.approx(sum(plain).item() / 2, rel=1e-5)


def test_without_dropout_rdrop_trains_exactly_like_the_plain_loss(corpus_slice: Path, tmp_path: Path) -> None:
    """No dropout: both copies agree, the KL is 0, and three optimizer steps land on the same weights."""
    common = ("model.dropout=0.0", "trainer.max_steps=3", "trainer.limit_val_batches=0")
    weights = []
    for name, alpha in (("plain", 0), ("rdrop", 5)):
        run = tiny_run(corpus_slice, tmp_path / name, f"optim.rdrop_alpha={alpha}", *common)
        run.trainer.fit(run.module, datamodule=run.datamodule)
        assert run.trainer.global_step == 3
        weights.append(run.module.model.state_dict())
    for key, plain in weights[0].items():
        if key.endswith("k_proj.bias"):  # softmax ignores a key bias: its gradient is rounding noise,
            continue  # which Adam scales up to +-lr (as in test_fused_adamw_updates_like_foreach)
        torch.testing.assert_close(weights[1][key], plain, rtol=1e-4, atol=1e-6, msg=key)


def test_a_negative_rdrop_alpha_names_the_key(corpus_slice: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"optim\.rdrop_alpha=-1; it must be >= 0"):
        tiny_run(corpus_slice, tmp_path, "optim.rdrop_alpha=-1")


def test_the_benchmark_counts_the_model_twice_per_rdrop_step(corpus_slice: Path, tmp_path: Path) -> None:
    run = tiny_run(corpus_slice, tmp_path, "optim.rdrop_alpha=1")
    batch, clock = first_training_batch(run), StepClock()
    clock.on_train_batch_end(run.trainer, run.module, None, batch, 0)
    lengths = batch_lengths(batch.src, batch.tgt_out, batch.pad_id)
    once = transformer_training_flops(run.module.model, *lengths)
    assert run.module.passes_per_batch == 2
    assert clock.flops == [2 * once] and clock.tokens == [batch.num_tokens]
