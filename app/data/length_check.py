"""Refusing, before training, length limits that leave a split (nearly) empty.

Training pairs longer than ``data.max_len`` subwords (or than ``model.max_positions`` leaves room for)
are dropped, and evaluation examples longer than the model's positions are truncated. A setting that
does not fit the corpus (``data.concat=16`` joins ~240 subwords an example, above the default
``data.max_len=128``) used to drop every training pair silently: Lightning stopped with "No training
batches" and the run ended in a traceback about a missing checkpoint. These checks run on the encoded
lengths as soon as a split is tokenized, before any Trainer exists, and refuse a split whose limits keep
less than ``data.min_kept`` of its examples (or that has none), naming the filter, how many examples it
dropped and the settings that would keep them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.data.corpus import CorpusError

# An experiment whose limits fit long joined examples, named when data.concat > 1 leaves a split empty.
LONG_INPUT_EXPERIMENT = "ablation_length"
LONG_INPUT_CONCAT = 64  # the largest data.concat its limits keep whole


@dataclass(frozen=True)
class LengthLimits:
    """The settings that decide which examples fit: ``data.max_len``, ``model.max_positions``,
    ``data.concat`` (named in the advice) and ``data.min_kept`` (the share a split must keep)."""

    max_len: int
    max_positions: int
    concat: int = 1
    min_kept: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_kept <= 1.0:
            raise CorpusError(
                f"data.min_kept must be in [0, 1] (0: only an empty split stops), got {self.min_kept}"
            )

    @property
    def train_limit(self) -> int:
        """The longest training side kept: ``max_len``, within the positions left after BOS/EOS."""
        return min(self.max_len, self.max_positions - 1)

    @property
    def eval_limit(self) -> int:
        """The longest evaluation side the model reads whole."""
        return self.max_positions - 1


class LengthError(CorpusError):
    """A split that the length limits leave (nearly) empty: raised before training starts."""


def check_training_lengths(src_len: np.ndarray, tgt_len: np.ndarray, kept: int, limits: LengthLimits) -> None:
    """Refuse a training split (side lengths (n,), ``kept`` of them passing the filters: the length
    filter and ``data.max_ratio``) that keeps less than ``limits.min_kept`` of its pairs with text."""
    longer = np.maximum(src_len, tgt_len)  # (n,)
    text = np.minimum(src_len, tgt_len) > 0  # (n,) pairs with text on both sides
    total = int(text.sum())
    if total == 0:
        raise LengthError(f"the training split has no pairs with text on both sides ({src_len.size:,} rows)")
    if kept > 0 and kept >= limits.min_kept * total:
        return
    too_long = int((text & (longer > limits.train_limit)).sum())
    by_ratio = total - too_long - kept
    limit = limits.train_limit
    setting = (
        f"data.max_len={limits.max_len}"
        if limit == limits.max_len
        else f"model.max_positions={limits.max_positions} leaves room for {limit}"
    )
    raise LengthError(
        f"the length filter keeps {kept:,} of {total:,} training examples, less than "
        f"data.min_kept={limits.min_kept:g} of them: {too_long:,} are longer than {limit} subwords "
        f"({setting})" + (f" and data.max_ratio drops {by_ratio:,} more" if by_ratio else "") + ". "
        f"To keep them all, set data.max_len>={int(longer[text].max())} and "
        f"model.max_positions>={int(longer[text].max()) + 1}{_long_inputs(limits)}, or lower data.min_kept "
        "(0: only an empty split stops)"
    )


def check_evaluation_lengths(
    split: str, src_len: np.ndarray, tgt_len: np.ndarray, limits: LengthLimits
) -> None:
    """Refuse an evaluation split (``valid``, ``test``; side lengths (n,)) that is empty, or of which
    less than ``limits.min_kept`` fits the model whole: its scores would be those of cut sentences."""
    if src_len.size == 0:
        raise LengthError(f"the {split} split has no examples: check its files (data.files.{split})")
    longer = np.maximum(src_len, tgt_len)  # (n,)
    fitting = int((longer <= limits.eval_limit).sum())
    if fitting >= limits.min_kept * src_len.size:
        return
    raise LengthError(
        f"{fitting:,} of {src_len.size:,} {split} examples fit the model whole, less than "
        f"data.min_kept={limits.min_kept:g} of them: {src_len.size - fitting:,} are longer than "
        f"{limits.eval_limit} subwords (model.max_positions={limits.max_positions} leaves room for "
        f"{limits.eval_limit}) and would be scored truncated. To keep them whole, set "
        f"model.max_positions>={int(longer.max()) + 1}{_long_inputs(limits)}, or lower data.min_kept "
        "(0: only an empty split stops)"
    )


def _long_inputs(limits: LengthLimits) -> str:
    """For joined examples, the experiment whose limits fit them (empty for one pair an example)."""
    if limits.concat == 1:
        return ""
    return (
        f" (data.concat={limits.concat} joins {limits.concat} sentence pairs an example; "
        f"experiment={LONG_INPUT_EXPERIMENT} sets both limits for data.concat up to {LONG_INPUT_CONCAT})"
    )
