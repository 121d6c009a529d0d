"""Tests for app.data.batching.TokenBucketBatchSampler."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from app.data.batching import BatchingError, TokenBucketBatchSampler


def make_lengths(n: int = 500, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 40) for _ in range(n)] + [120, 95]  # two examples longer than the budget


MAX_TOKENS = 90


def flat(batches: list[list[int]]) -> list[int]:
    return [index for batch in batches for index in batch]


def padded_size(batch: list[int], lengths: list[int]) -> int:
    return len(batch) * max(lengths[i] for i in batch)


def test_each_example_once_and_budget_respected() -> None:
    lengths = make_lengths()
    sampler = TokenBucketBatchSampler(lengths=lengths, max_tokens=MAX_TOKENS, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(flat(batches)) == list(range(len(lengths)))
        assert len(batches) == len(sampler)
        for batch in batches:
            assert padded_size(batch, lengths) <= MAX_TOKENS or len(batch) == 1
    over_long = [batch for batch in batches if padded_size(batch, lengths) > MAX_TOKENS]
    assert sorted(map(tuple, over_long)) == [(len(lengths) - 2,), (len(lengths) - 1,)]


def test_batches_are_length_homogeneous() -> None:
    lengths = make_lengths()
    batches = list(TokenBucketBatchSampler(lengths=lengths, max_tokens=MAX_TOKENS, shuffle=False))
    maxima = [max(lengths[i] for i in batch) for batch in batches]
    minima = [min(lengths[i] for i in batch) for batch in batches]
    assert maxima == sorted(maxima)  # without shuffle: shortest first
    assert all(low >= high_prev for low, high_prev in zip(minima[1:], maxima, strict=False))
    assert batches == list(TokenBucketBatchSampler(lengths=lengths, max_tokens=MAX_TOKENS, shuffle=False))


def test_max_sentences() -> None:
    lengths = [2] * 50
    batches = list(TokenBucketBatchSampler(lengths=lengths, max_tokens=1000, max_sentences=8))
    assert max(map(len, batches)) == 8
    assert sorted(flat(batches)) == list(range(50))


def test_order_changes_per_epoch_and_is_reproducible() -> None:
    lengths = make_lengths()

    def epoch_batches(seed: int, epoch: int) -> list[list[int]]:
        sampler = TokenBucketBatchSampler(lengths=lengths, max_tokens=MAX_TOKENS, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert epoch_batches(0, 0) != epoch_batches(0, 1)
    assert epoch_batches(0, 1) == epoch_batches(0, 1)
    assert epoch_batches(5, 1) != epoch_batches(7, 1)


def test_equal_lengths_are_mixed_between_epochs() -> None:
    sampler = TokenBucketBatchSampler(lengths=[4] * 64, max_tokens=32)  # 8 per batch
    first = {frozenset(batch) for batch in sampler}
    sampler.set_epoch(1)
    second = {frozenset(batch) for batch in sampler}
    assert first != second


def shards(lengths: list[int], replicas: int, epoch: int = 0, **kwargs: object) -> list[list[list[int]]]:
    result = []
    for rank in range(replicas):
        sampler = TokenBucketBatchSampler(
            lengths=lengths, max_tokens=MAX_TOKENS, num_replicas=replicas, rank=rank, seed=11, **kwargs
        )
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        result.append(batches)
    return result


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shards_disjoint_cover_all_equal_counts(replicas: int, shuffle: bool) -> None:
    lengths = make_lengths()
    single = TokenBucketBatchSampler(lengths=lengths, max_tokens=MAX_TOKENS)
    # The setup must exercise the remainder handling (splitting batches).
    assert any(len(single) % r for r in (2, 3))
    for epoch in range(2):
        per_rank = shards(lengths, replicas, epoch, shuffle=shuffle)
        assert len({len(batches) for batches in per_rank}) == 1
        all_indices = [i for batches in per_rank for i in flat(batches)]
        assert sorted(all_indices) == list(range(len(lengths)))  # disjoint and complete
        for batches in per_rank:
            assert all(padded_size(b, lengths) <= MAX_TOKENS or len(b) == 1 for b in batches)


def test_shards_balance_lengths_across_ranks_at_each_step() -> None:
    lengths = list(range(1, 61))  # distinct lengths; with max_tokens=60 batches are small
    per_rank = shards(lengths, 2)
    for step_batches in zip(*per_rank, strict=True):
        maxima = [max(lengths[i] for i in batch) for batch in step_batches]
        assert max(maxima) - min(maxima) <= 15


def test_repeats_only_when_nothing_can_be_split() -> None:
    lengths = [3, 1, 2, 5, 4]  # single-example batches: 5 examples over 3 ranks -> 1 repeat of the shortest
    per_rank = shards(lengths, 3, max_sentences=1)
    assert [len(batches) for batches in per_rank] == [2, 2, 2]
    counts = Counter(flat([b for batches in per_rank for b in batches]))
    assert set(counts) == set(range(5))
    assert [index for index, count in counts.items() if count > 1] == [1]  # index 1 is the shortest


def test_fewer_examples_than_ranks() -> None:
    per_rank = shards([7], 3)
    assert per_rank == [[[0]], [[0]], [[0]]]


def test_empty_dataset() -> None:
    sampler = TokenBucketBatchSampler(lengths=[], max_tokens=10, num_replicas=2, rank=1)
    assert len(sampler) == 0
    assert list(sampler) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be > 0, got 0"),
        ({"num_replicas": 2, "rank": 2}, "0 <= rank < num_replicas=2, got 2"),
        ({"rank": -1}, "got -1"),
        ({"num_replicas": 0}, "num_replicas must be >= 1, got 0"),
        ({"max_sentences": 0}, "max_sentences must be >= 1 or None, got 0"),
        ({"lengths": [3, -2]}, "lengths must be >= 0, got -2 at index 1"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"lengths": [1, 2, 3], "max_tokens": 10, **kwargs}
    with pytest.raises(BatchingError, match=message):
        TokenBucketBatchSampler(**arguments)
