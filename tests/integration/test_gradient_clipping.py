"""Gradient clipping of TranslationModule under FSDP, with a real FSDP module on CPU (gloo, one process).

Lightning only runs its FSDP strategy on GPUs, so the trainer here is a stand-in holding what
``configure_gradient_clipping`` reads from Lightning: the strategy's wrapped model and the precision
plugin (Lightning's real ``FSDPPrecision``, which refuses norm clipping itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from pytorch_lightning.plugins.precision import FSDPPrecision
from torch.distributed.fsdp import FullyShardedDataParallel

from app.data.tokenizer import Tokenizer
from app.training.module import TranslationModule

pytestmark = pytest.mark.usefixtures("single_torch_thread")

MAX_NORM = 1e-3


@pytest.fixture
def process_group() -> Iterator[None]:
    """A one-process gloo group, as FSDP needs one (removed afterwards)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def gradient_norm(module: torch.nn.Module) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters()])))


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_fsdp_norm_clipping_goes_through_the_sharded_root(
    spm_tokenizer: Tokenizer,
    make_transformer: Callable[..., torch.nn.Module],
    process_group: None,
    monkeypatch: pytest.MonkeyPatch,
    fused: bool,
) -> None:
    model = make_transformer(
        src_vocab_size=spm_tokenizer.vocab_size,
        tgt_vocab_size=spm_tokenizer.vocab_size,
        pad_id=spm_tokenizer.pad_id,
    ).train()
    module = TranslationModule(
        model=model, src_tokenizer=spm_tokenizer, tgt_tokenizer=spm_tokenizer, config={}
    )
    root = FullyShardedDataParallel(module, device_id=torch.device("cpu"))
    calls: list[float] = []
    clip = root.clip_grad_norm_
    monkeypatch.setattr(root, "clip_grad_norm_", lambda max_norm: calls.append(max_norm) or clip(max_norm))
    module.trainer = SimpleNamespace(
        strategy=SimpleNamespace(model=root),
        precision_plugin=FSDPPrecision("32-true"),
        gradient_clip_val=MAX_NORM,
        gradient_clip_algorithm="norm",
    )
    optimizer = torch.optim.AdamW(root.parameters(), fused=fused)

    src, tgt_in = torch.tensor([[5, 6, 7, 8, 3]]), torch.tensor([[2, 9, 10]])
    root(src, tgt_in).square().mean().backward()
    assert gradient_norm(root) > 10 * MAX_NORM
    module.configure_gradient_clipping(optimizer, MAX_NORM, "norm")
    assert calls == [MAX_NORM]
    assert gradient_norm(root) == pytest.approx(MAX_NORM, rel=1e-4)
