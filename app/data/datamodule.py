"""LightningDataModule: Arrow-encoded splits, token-bucket training batches, ordered evaluation batches."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from app.data.batch import Collator
from app.data.batching import TokenBucketBatchSampler
from app.data.corpora import Corpora
from app.data.corpus import keep_mask
from app.data.encoded import EncodedPairs, ResampledPairs, encode_split
from app.data.length_check import LengthLimits, check_evaluation_lengths, check_training_lengths
from app.data.multilingual import temperature_rows
from app.data.tokenizer import SubwordSampling, Tokenizer
from app.errors import ConfigError

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

    ``corpora`` are the run's splits (:class:`app.data.corpora.Corpora`); ``setup`` tokenizes their
    examples into the Arrow cache under ``cache_dir`` (or maps an existing cache) with ``num_proc`` processes.
    Training pairs that are empty, longer than ``max_len`` subwords or, with ``max_ratio``, more unequal
    in length than that are dropped (and counted). Evaluation splits are never filtered: a sequence
    longer than the model accepts (``max_positions`` including EOS/BOS) is truncated for the validation
    loss, and counted in the log. With ``subword_sampling`` enabled, training batches carry a freshly
    sampled segmentation of each pair (subword regularization); evaluation splits keep the one-best
    segmentation the model is evaluated and used with. Training and validation batches are ``layout``
    ``padded`` (rounded up to ``pad_to_multiple``) or ``packed`` (:mod:`app.data.batch`). ``num_workers``
    DataLoader processes read and pad batches off the training process. The training pairs of the
    corpus's directions are mixed by ``sampling_temperature`` (:func:`app.data.multilingual.temperature_rows`;
    one direction: all of them).
    A split that these limits leave with less than ``min_kept`` of its examples (training: kept, evaluation:
    read whole), or with none, is refused in ``setup`` (:mod:`app.data.length_check`), which ``build_fit``
    calls before any Trainer is built.
    """

    def __init__(
        self,
        *,
        corpora: Corpora,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        max_tokens: int,
        max_len: int,
        max_positions: int,
        cache_dir: str | os.PathLike[str],
        eval_max_tokens: int | None = None,
        max_ratio: float | None = None,
        seed: int = 0,
        num_proc: int = 1,
        num_workers: int = 0,
        subword_sampling: SubwordSampling | None = None,
        sampling_temperature: float = 1.0,
        min_kept: float = 0.5,
        layout: str = "padded",
        pad_to_multiple: int = 1,
    ) -> None:
        super().__init__()
        if num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {num_workers}")
        self.corpora = corpora
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.max_tokens, self.max_positions = max_tokens, max_positions
        self.max_len = min(max_len, max_positions - 1)  # room for the EOS / BOS the collator adds
        self.limits = LengthLimits(max_len, max_positions, corpora.layout.concat, min_kept)
        self.max_ratio = max_ratio
        self.eval_max_tokens = eval_max_tokens or max_tokens
        self.cache_dir = Path(cache_dir)
        self.seed, self.num_proc, self.num_workers = seed, num_proc, num_workers
        self.subword_sampling = subword_sampling or SubwordSampling()
        self.sampling_temperature = sampling_temperature
        self.collate = Collator(
            pad_id=tgt_tokenizer.pad_id,
            bos_id=tgt_tokenizer.bos_id,
            eos_id=tgt_tokenizer.eos_id,
            layout=layout,
            pad_to_multiple=pad_to_multiple,
            max_width=max_positions,
        )
        self.datasets: dict[str, EncodedPairs] = {}
        self.dropped_train_pairs = 0

    @classmethod
    def from_config(
        cls,
        data: Mapping[str, Any],
        *,
        corpora: Corpora,
        tokenizers: tuple[Tokenizer, Tokenizer],
        max_positions: int,
        seed: int,
    ) -> TranslationDataModule:
        """The datamodule the ``data`` config describes (the one place its batching keys are read)."""
        for key, nullable in (("max_tokens", False), ("eval_max_tokens", True)):  # null: max_tokens
            value = data.get(key)
            if value is None and nullable:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"data.{key}={value!r}: a batch's budget of padded tokens, a positive int")
        return cls(
            corpora=corpora,
            src_tokenizer=tokenizers[0],
            tgt_tokenizer=tokenizers[1],
            max_tokens=data["max_tokens"],
            max_len=data["max_len"],
            max_positions=max_positions,
            cache_dir=Path(data["cache_dir"]) / "tokens",
            eval_max_tokens=data.get("eval_max_tokens"),
            max_ratio=data.get("max_ratio"),
            seed=seed,
            num_proc=data.get("num_proc", 1),
            num_workers=data.get("num_workers", 0),
            subword_sampling=SubwordSampling.from_config(
                data.get("subword_sampling"), data["subword"].get("model_type", "unigram")
            ),
            sampling_temperature=data.get("sampling_temperature") or 1.0,
            min_kept=data.get("min_kept", 0.5),
            layout=data.get("layout") or "padded",
            pad_to_multiple=data.get("pad_to_multiple") or 1,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        for split, texts in self.corpora.texts().items():
            encoded = encode_split(
                texts,
                self.src_tokenizer,
                self.tgt_tokenizer,
                cache_dir=self.cache_dir,
                num_proc=self.num_proc,
                name=split,
            )
            self.datasets[split] = (
                self._filter(encoded) if split == "train" else self._truncate(split, encoded)
            )

    def _filter(self, encoded: datasets.Dataset) -> EncodedPairs:
        """The training pairs that pass the length (and ratio) filter, decided on the one-best length
        columns; re-segmented in every batch when subword sampling is on."""
        src_len, tgt_len = EncodedPairs(encoded).side_lengths()
        keep, counts = keep_mask(src_len, tgt_len, max_len=self.max_len, max_ratio=self.max_ratio)
        self.dropped_train_pairs = counts.dropped
        log.info(
            "training pairs: %d kept, %d dropped (empty or > %d subwords)",
            counts.kept,
            counts.empty_or_long,
            self.max_len,
        )
        if self.max_ratio is not None:
            log.info("training pairs: %d more dropped (length ratio > %g)", counts.ratio, self.max_ratio)
        check_training_lengths(src_len, tgt_len, counts.kept, self.limits)
        rows = self._mixed(np.flatnonzero(keep))
        if self.subword_sampling.enabled:
            return ResampledPairs(
                encoded,
                self.corpora["train"].texts,
                (self.src_tokenizer, self.tgt_tokenizer),
                self.subword_sampling,
                seed=self.seed,
                rows=rows,
                truncate=self.max_positions - 1,
            )
        return EncodedPairs(encoded, rows=rows)

    def _mixed(self, rows: np.ndarray) -> np.ndarray:
        """The kept training ``rows`` (n,) an epoch draws, each direction getting its temperature share."""
        codes, names = self.corpora["train"].direction_codes()  # (N,) a direction index per row
        rows = temperature_rows(rows, codes[rows], self.sampling_temperature, self.seed)
        counts = np.bincount(codes[rows], minlength=len(names))
        log.info("training pairs per direction: %s", dict(zip(names, counts.tolist(), strict=True)))
        return rows

    def _truncate(self, split: str, encoded: datasets.Dataset) -> EncodedPairs:
        limit = self.max_positions - 1
        src_len, tgt_len = EncodedPairs(encoded).side_lengths()
        check_evaluation_lengths(split, src_len, tgt_len, self.limits)
        too_long = int((src_len > limit).sum() + (tgt_len > limit).sum())
        if too_long:
            log.warning(
                "%s: %d sequences longer than %d subwords truncated for the loss", split, too_long, limit
            )
        return EncodedPairs(encoded, truncate=limit)

    def _loader(self, split: str, *, train: bool) -> ResumableDataLoader:
        """Token-bucket batches of ``split``, sharded over the trainer's ranks (training and validation).

        Validation batches keep the length order (no shuffle); each rank decodes its share and the
        LightningModule gathers the hypotheses back by example index. With ``num_workers`` the batch
        order still comes from the sampler in this process (so resuming is unchanged); workers only
        fetch and pad the batches it names.
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
            persistent_workers=self.num_workers > 0,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", train=False)
