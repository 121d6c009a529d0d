"""Model FLOPs counted from shapes agree with PyTorch's own count of the matrix products."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from app.hardware import cpu_description, matmul_peak_tflops
from app.models.flops import (
    attention_width,
    batch_lengths,
    supports_flop_count,
    transformer_forward_flops,
    transformer_training_flops,
)

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def counted_by_torch(model: torch.nn.Module, src: torch.Tensor, tgt: torch.Tensor, backward: bool) -> int:
    with FlopCounterMode(display=False) as counter:
        logits = model(src, tgt)
        if backward:
            logits.float().sum().backward()
    return counter.get_total_flops()


def unpadded_batch(batch: int = 3, src_len: int = 7, tgt_len: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randint(4, 40, (batch, src_len)), torch.randint(4, 40, (batch, tgt_len))


@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_forward_flops_match_torch_on_an_unpadded_batch(make_transformer, num_kv_heads: int | None) -> None:
    """The eager kernel computes the full T x T causal score matrix; we count only the visible half."""
    model = make_transformer(attention={"kernel": "eager", "num_kv_heads": num_kv_heads})
    src, tgt = unpadded_batch()
    s_len, t_len = torch.full((3,), src.size(1)), torch.full((3,), tgt.size(1))
    ours = transformer_forward_flops(model, s_len, t_len)
    masked_half = sum(
        4 * attention_width(layer.self_attn) * 3 * (t_len[0] ** 2 - t_len[0] * (t_len[0] + 1) // 2)
        for layer in model.decoder
    )
    assert ours + int(masked_half) == counted_by_torch(model, src, tgt, backward=False)


def test_a_training_step_is_three_forward_passes(make_transformer) -> None:
    model = make_transformer(attention={"kernel": "eager"}).train()
    src, tgt = unpadded_batch()
    s_len, t_len = torch.full((3,), src.size(1)), torch.full((3,), tgt.size(1))
    torch_total = counted_by_torch(model, src, tgt, backward=True)
    ours = transformer_training_flops(model, s_len, t_len)
    # torch also counts the masked causal half, three times: within a few percent at these lengths
    assert ours <= torch_total <= 1.1 * ours


def test_padding_is_not_counted(make_transformer) -> None:
    model = make_transformer()
    src = torch.tensor([[5, 6, 3, 0, 0], [5, 6, 7, 8, 3]])
    tgt_out = torch.tensor([[9, 3, 0], [9, 9, 3]])
    s_len, t_len = batch_lengths(src, tgt_out, pad_id=0)
    assert s_len.tolist() == [3, 5] and t_len.tolist() == [2, 3]
    one = transformer_forward_flops(model, s_len[:1], t_len[:1])
    two = transformer_forward_flops(model, s_len[1:], t_len[1:])
    assert transformer_forward_flops(model, s_len, t_len) == one + two
    assert one < two


def test_only_transformers_are_counted(make_transformer) -> None:
    assert supports_flop_count(make_transformer())
    assert not supports_flop_count(torch.nn.LSTM(4, 4))


def test_matmul_peak_and_cpu_description_are_measured() -> None:
    assert matmul_peak_tflops(torch.float32, size=256, repeats=3) > 0
    described = cpu_description()
    assert described["cpu_model"] and isinstance(described["cpu_flags"], list)
