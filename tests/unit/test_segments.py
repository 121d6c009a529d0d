"""Packed batches (:mod:`app.attention.segments`): every kernel attends a packed batch as it attends the
padded one, at every site, so a kernel with a padding-free form of its own is tested against the same
reference."""

from __future__ import annotations

import pytest
import torch
from helpers.attention_menu import ATTENTION

from app.attention import MultiHeadAttention, build_kernel
from app.attention.segments import Segments

pytestmark = pytest.mark.usefixtures("single_torch_thread")

D, HEADS = 8, 2


def test_segments_of_lengths() -> None:
    segments = Segments.of_lengths([3, 1, 2])
    assert segments.offsets.tolist() == [0, 3, 4, 6]
    assert segments.ids.tolist() == [0, 0, 0, 1, 2, 2]
    assert segments.positions.tolist() == [0, 1, 2, 0, 0, 1]
    assert (segments.batch, segments.tokens, segments.longest) == (3, 6, 3)
    assert segments.key_mask().tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    mask = torch.tensor([[True, True, False], [True, True, True]])
    assert Segments.of_mask(mask).lengths.tolist() == [2, 3]


@pytest.mark.parametrize("lengths", [[], [2, 0]])
def test_segments_refuse_empty_sequences(lengths: list[int]) -> None:
    with pytest.raises(ValueError, match=r"non-empty|token"):
        Segments.of_lengths(lengths)


def test_padded_rows_round_trip() -> None:
    segments = Segments.of_lengths([2, 3])
    rows = torch.arange(5.0)[:, None]  # (N, 1)
    padded = segments.padded().unpack(rows)  # (B, S, 1)
    assert padded[..., 0].tolist() == [[0.0, 1.0, 0.0], [2.0, 3.0, 4.0]]
    assert torch.equal(segments.padded().pack(padded), rows)


def layer(entry: dict, site: str) -> MultiHeadAttention:
    override = entry.get("sites", {}).get(site, {})  # a site's own kernel comes with its own options
    spec = {**entry, "options": {}, **override} if "kernel" in override else entry
    torch.manual_seed(0)
    kernel = build_kernel(spec["kernel"], **spec.get("options", {}))
    heads = spec.get("num_kv_heads", entry.get("num_kv_heads"))
    return MultiHeadAttention(d_model=D, num_heads=HEADS, num_kv_heads=heads, kernel=kernel).double().eval()


@pytest.mark.parametrize("site", ["encoder_self", "decoder_self", "cross"])
@pytest.mark.parametrize("name", list(ATTENTION))
def test_a_packed_batch_attends_as_the_padded_one(name: str, site: str) -> None:
    attention = layer(ATTENTION[name], site)
    torch.manual_seed(1)
    q_lengths, k_lengths = [4, 1, 6], [5, 3, 2]  # cross-attention: another length per sequence
    queries = Segments.of_lengths(q_lengths)
    keys = queries if site != "cross" else Segments.of_lengths(k_lengths)
    x = torch.randn(queries.tokens, D, dtype=torch.float64)  # (Nq, D)
    memory = torch.randn(keys.tokens, D, dtype=torch.float64) if site == "cross" else None
    packed = attention.forward_packed(
        x,
        queries,
        memory=memory,
        memory_segments=None if memory is None else keys,
        causal=site == "decoder_self",
    )
    padded_x = queries.padded().unpack(x)  # (B, Sq, D), zeros at the padding
    padded_memory = None if memory is None else keys.padded().unpack(memory)
    reference, _ = attention(
        padded_x,
        memory=padded_memory,
        key_mask=None if site == "decoder_self" else keys.key_mask(),
        causal=site == "decoder_self",
    )
    assert packed.shape == (queries.tokens, D)
    torch.testing.assert_close(packed, queries.padded().pack(reference), rtol=1e-10, atol=1e-12)
