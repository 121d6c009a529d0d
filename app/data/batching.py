"""Token-budget batching: batches of similar-length examples whose padded size stays under a budget.

Sorting by length before packing keeps padding small; the budget ``max_tokens`` bounds the padded
tensor ``len(batch) * max(lengths in batch)`` instead of the number of sentences, so short sentences
form big batches and long ones small batches, and memory use is steady.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

__all__ = ["BatchingError", "TokenBucketBatchSampler"]


class BatchingError(ValueError):
    """Invalid batching arguments."""


def _validate(
    lengths: np.ndarray, max_tokens: int, num_replicas: int, rank: int, max_sentences: int | None
) -> None:
    if lengths.ndim != 1:
        raise BatchingError(f"lengths must be a flat sequence of ints, got shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise BatchingError(
            f"lengths must be >= 0, got {int(lengths.min())} at index {int(lengths.argmin())}"
        )
    if max_tokens <= 0:
        raise BatchingError(f"max_tokens must be > 0, got {max_tokens}")
    if num_replicas < 1:
        raise BatchingError(f"num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise BatchingError(f"rank must satisfy 0 <= rank < num_replicas={num_replicas}, got {rank}")
    if max_sentences is not None and max_sentences < 1:
        raise BatchingError(f"max_sentences must be >= 1 or None, got {max_sentences}")


class TokenBucketBatchSampler(Sampler[list[int]]):
    """Yields lists of example indices whose padded size ``len(batch) * max_len`` is <= ``max_tokens``.

    Each epoch, examples are sorted by length (ties broken randomly from ``seed + epoch`` when
    ``shuffle``, by index otherwise) and packed greedily into batches; an example longer than
    ``max_tokens`` becomes a batch of its own, nothing is ever dropped. ``max_sentences`` optionally
    caps the batch size as well. With ``shuffle`` the order of batches is redrawn every epoch from
    ``seed + epoch`` (call :meth:`set_epoch`, as Lightning does); without it, batches come shortest first.

    Sharding (``num_replicas > 1``): every rank must see the same number of batches or DDP hangs.
    The epoch's batches are therefore made a multiple of ``num_replicas`` by splitting the batch with
    the most examples in two (repeatedly, at most ``num_replicas - 1`` times); split batches are
    smaller, so they still respect the budget and every example is still seen exactly once per epoch
    across ranks. Only when no batch can be split any more (every batch is a single example, e.g.
    fewer examples than ranks or ``max_sentences=1``) are batches repeated: the first
    ``num_replicas - count % num_replicas`` batches in length order (the shortest single examples,
    cycling through them if there are fewer examples than ranks) are appended once more.
    Consecutive batches in length order form a group of ``num_replicas``, groups are shuffled, and
    rank ``r`` takes the ``r``-th batch of each group, so the ranks work on similar lengths at each step.

    With Lightning DDP, pass ``num_replicas=trainer.world_size, rank=trainer.global_rank`` and set
    ``Trainer(use_distributed_sampler=False)`` so Lightning does not wrap this sampler.
    """

    def __init__(
        self,
        *,
        lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        max_sentences: int | None = None,
    ) -> None:
        self._lengths = np.asarray(lengths, dtype=np.int64)
        _validate(self._lengths, max_tokens, num_replicas, rank, max_sentences)
        self._budget_lengths = np.maximum(self._lengths, 1)  # an empty example still costs a slot
        # numpy's stable sort is a radix sort for 16-bit keys: seconds faster on millions of sentences
        short = self._lengths.size == 0 or self._lengths.max() < 2**16
        self._sort_keys = self._lengths.astype(np.uint16) if short else self._lengths
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.max_sentences = max_sentences
        self.epoch = 0
        self._consumed = 0  # batches of this epoch the training loop has finished (see mark_consumed)
        self._resume_at: tuple[int, int] | None = None  # (epoch, batches to skip) from load_state_dict
        # Batch boundaries depend only on the sorted length sequence, which is the same every epoch.
        self._num_batches_total = len(self._equalize(self._pack(self._sorted_indices(None))))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle to use (different epochs give different batch orders)."""
        if epoch != self.epoch:
            self._consumed = 0
        self.epoch = epoch

    def __len__(self) -> int:
        """Number of batches this rank yields per epoch (the same for every rank and epoch)."""
        return self._num_batches_total // self.num_replicas

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's batches of the epoch; after :meth:`load_state_dict`, only those not trained on yet."""
        skip = 0
        if self._resume_at is not None and self._resume_at[0] == self.epoch:
            skip = self._resume_at[1]
        self._resume_at = None
        batches = self._epoch_batches(self.epoch)
        for batch in batches[self.rank :: self.num_replicas][skip:]:
            yield batch.tolist()

    # -- resuming mid-epoch ------------------------------------------------------------------------------

    def mark_consumed(self, batches: int) -> None:
        """Record that the training loop has finished the first ``batches`` batches of the current epoch.

        The loop, not the iterator, knows this: data loaders fetch batches ahead of the step that uses them.
        """
        self._consumed = batches

    def state_dict(self) -> dict[str, int]:
        """Where training stands in the batch order: enough to continue with the very next batch."""
        return {
            "epoch": self.epoch,
            "batches_consumed": self._consumed,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "batches_per_epoch": len(self),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state``: iterating the saved epoch yields only the batches after the consumed ones.

        Which epoch comes next is the training loop's decision (``set_epoch``): a checkpoint written at the
        end of an epoch resumes with the next epoch's full order. When the batch order cannot be reproduced
        (another seed, number of ranks or corpus), the saved epoch restarts at its first batch (a warning).
        """
        epoch, consumed = int(state["epoch"]), int(state["batches_consumed"])
        same_order = (state.get("seed"), state.get("num_replicas"), state.get("batches_per_epoch")) == (
            self.seed,
            self.num_replicas,
            len(self),
        )
        if not same_order:
            saved = (state.get("seed"), state.get("num_replicas"), state.get("batches_per_epoch"))
            warnings.warn(
                f"the checkpoint's batch order (seed, ranks, batches per epoch) {saved} differs from this "
                f"run's {self.seed, self.num_replicas, len(self)}: epoch {epoch} restarts at its first batch",
                stacklevel=2,
            )
            consumed = 0
        self._resume_at = (epoch, consumed)
        if epoch == self.epoch:
            self._consumed = consumed

    def _sorted_indices(self, rng: np.random.Generator | None) -> np.ndarray:
        """Indices in ascending length order; equal lengths in random order when ``rng`` is given."""
        if rng is None:
            return np.argsort(self._sort_keys, kind="stable")
        permutation = rng.permutation(self._lengths.size)
        return permutation[np.argsort(self._sort_keys[permutation], kind="stable")]

    def _pack(self, order: np.ndarray) -> list[np.ndarray]:
        """Greedy packing of length-sorted indices into batches within the token budget.

        Lengths ascend along ``order``, so a batch's padded size is its size times its *last* length and
        grows with every example added: the greedy batch starting at ``start`` ends before the first
        position ``end`` where ``(end - start + 1) * length[end]`` exceeds the budget, found by binary
        search over a window of at most ``max_tokens // length[start] + 1`` positions (vectorised: a few
        numpy calls per batch, not a Python step per example, for corpora of millions of sentences).
        """
        lengths = self._budget_lengths[order]
        limit = self.max_tokens if self.max_sentences is None else min(self.max_tokens, self.max_sentences)
        batches: list[np.ndarray] = []
        start = 0
        while start < order.size:
            # k examples from here cost at least k * lengths[start]: no batch can be longer than this window
            window = lengths[start : start + min(limit, self.max_tokens // int(lengths[start]) + 1)]
            cost = np.arange(1, window.size + 1) * window  # padded size if the batch ended there
            size = max(1, int(np.searchsorted(cost, self.max_tokens, side="right")))  # cost ascends
            batches.append(order[start : start + size])
            start += size
        return batches

    def _equalize(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """Make the batch count a multiple of ``num_replicas`` (see the class docstring for the policy)."""
        batches = list(batches)
        while len(batches) % self.num_replicas:
            largest = max(range(len(batches)), key=lambda i: len(batches[i]))
            batch = batches[largest]
            if len(batch) < 2:
                break
            half = (len(batch) + 1) // 2
            batches[largest : largest + 1] = [batch[:half], batch[half:]]
        missing = -len(batches) % self.num_replicas
        return batches + [batches[i % len(batches)].copy() for i in range(missing)]

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """All ranks' batches for ``epoch``, interleaved: rank ``r`` owns positions ``r::num_replicas``."""
        rng = np.random.default_rng(self.seed + epoch) if self.shuffle else None
        batches = self._equalize(self._pack(self._sorted_indices(rng)))
        if rng is None:
            return batches
        groups = [
            batches[start : start + self.num_replicas] for start in range(0, len(batches), self.num_replicas)
        ]
        return [batch for group_index in rng.permutation(len(groups)) for batch in groups[group_index]]
