"""LightningDataModule: encoded splits, token-bucket training batches, ordered evaluation batches."""

from __future__ import annotations

import logging

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from app.data.batch import Collator, ParallelIds
from app.data.batching import TokenBucketBatchSampler
from app.data.corpus import ParallelText, filter_pairs
from app.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class ResumableDataLoader(DataLoader):
    """A DataLoader whose position in the epoch goes into Lightning checkpoints and comes back on resume.

    Lightning saves ``state_dict()`` of every training loader that has one (under the fit loop's state)
    and calls ``load_state_dict`` before it iterates again, so a run resumed mid-epoch continues with
    the batch after the last one trained on. The position itself is kept by the batch sampler.
    """

    def state_dict(self) -> dict[str, int]:
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batch_sampler.load_state_dict(state)


class TranslationDataModule(pl.LightningDataModule):
    """Holds the encoded corpus; training batches are sharded over ranks by the sampler itself.

    Training pairs that are empty or longer than ``max_len`` subwords are dropped (and counted).
    Evaluation splits are never filtered: a sequence longer than the model accepts (``max_positions``
    including EOS/BOS) is truncated for the validation loss, and counted in the log.
    """

    def __init__(
        self,
        *,
        corpora: dict[str, ParallelText],
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        max_tokens: int,
        max_len: int,
        max_positions: int,
        eval_max_tokens: int | None = None,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.corpora = corpora
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.max_tokens, self.max_positions = max_tokens, max_positions
        self.max_len = min(max_len, max_positions - 1)  # room for the EOS / BOS the collator adds
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.seed, self.num_workers = seed, num_workers
        self.collate = Collator(
            pad_id=tgt_tokenizer.pad_id, bos_id=tgt_tokenizer.bos_id, eos_id=tgt_tokenizer.eos_id
        )
        self.datasets: dict[str, ParallelIds] = {}
        self.dropped_train_pairs = 0

    @property
    def valid_references(self) -> list[str]:
        return self.corpora["valid"].tgt

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        for split, text in self.corpora.items():
            src, tgt = self.src_tokenizer.encode(text.src), self.tgt_tokenizer.encode(text.tgt)
            if split == "train":
                keep, self.dropped_train_pairs = filter_pairs(src, tgt, max_len=self.max_len)
                src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
                log.info(
                    "training pairs: %d kept, %d dropped (empty or > %d subwords)",
                    len(keep),
                    self.dropped_train_pairs,
                    self.max_len,
                )
            else:
                src, tgt = self._truncate(split, src), self._truncate(split, tgt)
            self.datasets[split] = ParallelIds(src, tgt)

    def _truncate(self, split: str, sequences: list[list[int]]) -> list[list[int]]:
        limit = self.max_positions - 1
        too_long = sum(len(s) > limit for s in sequences)
        if too_long:
            log.warning(
                "%s: %d sequences longer than %d subwords truncated for the loss", split, too_long, limit
            )
        return [s[:limit] for s in sequences]

    def _loader(self, split: str, *, train: bool) -> ResumableDataLoader:
        """Token-bucket batches of ``split``, sharded over the trainer's ranks (training and validation).

        Validation batches keep the length order (no shuffle); each rank decodes its share and the
        LightningModule gathers the hypotheses back by example index.
        """
        dataset = self.datasets[split]
        trainer = self.trainer
        sampler = TokenBucketBatchSampler(
            lengths=dataset.lengths(),
            max_tokens=self.max_tokens if train else self.eval_max_tokens,
            shuffle=train,
            seed=self.seed,
            num_replicas=trainer.world_size if trainer else 1,
            rank=trainer.global_rank if trainer else 0,
        )
        if train and trainer:  # the loop's epoch, already restored when resuming (see BatchSamplerEpoch)
            sampler.set_epoch(trainer.current_epoch)
        # A private generator: every iter() of a DataLoader draws a worker seed from its generator, and
        # drawing from the global one would shift dropout masks whenever Lightning creates an iterator
        # (it creates a different number of them in a resumed run than in an uninterrupted one).
        return ResumableDataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", train=False)
