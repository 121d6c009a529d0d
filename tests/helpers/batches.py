"""A small padded batch of random token ids, the shape every model test feeds its tiny models."""

from __future__ import annotations

import torch

BOS, EOS, PAD, VOCAB = 2, 3, 0, 40


def random_batch(seed: int = 0, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded sources (B=3, S=7) with EOS and BOS-led target inputs (B=3, T=6) with padding."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (3, 7), generator=gen)
    tgt = torch.randint(4, vocab, (3, 6), generator=gen)
    tgt[:, 0] = BOS
    for row, (src_len, tgt_len) in enumerate([(7, 6), (4, 3), (2, 5)]):
        src[row, src_len - 1] = EOS
        src[row, src_len:] = PAD
        tgt[row, tgt_len:] = PAD
    return src, tgt


def random_sources(count: int, min_len: int, max_len: int, vocab: int = VOCAB, seed: int = 0) -> torch.Tensor:
    """``count`` right-padded sources (count, longest) of ``min_len`` to ``max_len`` tokens, EOS included,
    over ids 4 .. vocab-1: the batch that search tests decode."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=gen)
    batch = torch.full((count, int(lengths.max())), PAD)
    for row, length in enumerate(lengths.tolist()):
        batch[row, : length - 1] = torch.randint(4, vocab, (length - 1,), generator=gen)
        batch[row, length - 1] = EOS
    return batch
