"""``evaluate(checkpoint, sources, references, settings)``: translate a test set, time it, score it.

The one place that turns a checkpoint into test scores and decoding speed. Training (results.json),
``translate.py --ref`` and ``scripts/bench_decode.py`` all call it, so their numbers are measured the
same way: the time covers tokenization, length-sorted batching, search and detokenization (what a user
of ``translate.py`` waits for), and the scores are sacreBLEU's (:mod:`app.inference.metrics`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from app.inference.engines import Engine
from app.inference.metrics import Scores, corpus_scores
from app.inference.translator import SearchSettings, Translator, load_translator


@dataclass(frozen=True)
class Evaluation:
    """Translations of a test set with their scores (None without references) and decoding cost."""

    checkpoint: str
    test_set: str
    settings: SearchSettings
    hypotheses: list[str]
    scores: Scores | None
    seconds: float  # wall-clock time of the timed translation pass
    target_tokens: int  # subword tokens of the outputs (EOS not counted)
    threads: int  # torch intra-op threads during the pass
    device: str

    @property
    def sentences(self) -> int:
        return len(self.hypotheses)

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / max(self.seconds, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.target_tokens / max(self.seconds, 1e-9)

    def speed(self) -> dict[str, Any]:
        """Decoding cost as plain numbers (rounded for reading)."""
        return {
            "sentences": self.sentences,
            "seconds": round(self.seconds, 2),
            "sentences_per_s": round(self.sentences_per_s, 1),
            "tokens_per_s": round(self.tokens_per_s),
            "threads": self.threads,
            "device": self.device,
        }

    def results(self, prefix: str = "test_") -> dict[str, Any]:
        """The keys results.json has always carried: checkpoint, test set, beam, scores, decoding cost."""
        speed = self.speed()
        return {
            "checkpoint": self.checkpoint,
            "test_set": self.test_set,
            "beam": self.settings.beam,
            "alpha": self.settings.alpha,
            **(self.scores.rounded(prefix=prefix) if self.scores else {}),
            f"{prefix}decode_seconds": speed["seconds"],
            f"{prefix}decode_sentences_per_s": speed["sentences_per_s"],
            f"{prefix}decode_tokens_per_s": speed["tokens_per_s"],
            f"{prefix}decode_threads": speed["threads"],
            f"{prefix}decode_device": speed["device"],
        }


def evaluate(
    checkpoint: str | os.PathLike[str] | Translator | Engine,
    sources: list[str],
    references: list[str] | None,
    settings: SearchSettings,
    *,
    device: str | torch.device = "cpu",
    test_set: str = "test",
    target_lang: str | None = None,
    warmup: bool = False,
    on_truncate: Callable[[int, int], None] | None = None,
) -> Evaluation:
    """Translate ``sources`` with ``checkpoint`` on ``device``, time it, and score against ``references``.

    ``checkpoint`` may be an already loaded :class:`Translator` or inference engine (then ``device`` is
    where it already is), so a benchmark can time several settings without reloading. ``warmup`` first
    translates one batch untimed (allocator and kernel caches warm, as in a long-running server).
    ``target_lang`` (an ISO code) adds the Moses-tokenized lowercased BLEU to the scores.
    Reference counts that differ from the source count raise ValueError before anything is translated.
    """
    if references is not None and len(references) != len(sources):
        raise ValueError(f"{len(sources)} source sentences but {len(references)} references")
    if isinstance(checkpoint, (str, os.PathLike)):
        translator, _ = load_translator(checkpoint, device=device)
        name = str(checkpoint)
    else:
        translator, name = checkpoint, "<loaded model>"
    if warmup:
        translator.translate(sources[: settings.batch_size], settings)
    hypotheses, seconds = timed_translation(translator, sources, settings, on_truncate)
    return Evaluation(
        checkpoint=name,
        test_set=test_set,
        settings=settings,
        hypotheses=hypotheses,
        scores=corpus_scores(hypotheses, references, target_lang) if references is not None else None,
        seconds=seconds,
        target_tokens=sum(len(ids) for ids in translator.tgt_tokenizer.encode(hypotheses)),
        threads=torch.get_num_threads(),
        device=str(translator.device),
    )


def timed_translation(
    translator: Translator | Engine,
    sources: list[str],
    settings: SearchSettings,
    on_truncate: Callable[[int, int], None] | None = None,
) -> tuple[list[str], float]:
    """Translations of ``sources`` and the seconds they took (GPU work finished before the clock stops)."""
    synchronize(translator.device)
    started = time.perf_counter()
    hypotheses = translator.translate(sources, settings, on_truncate=on_truncate)
    synchronize(translator.device)
    return hypotheses, time.perf_counter() - started


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
