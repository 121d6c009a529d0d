"""``evaluate(engine, sources, references, settings)``: translate a test set, time it, score it.

The one place that turns an engine into test scores and decoding speed. Training (results.json),
choosing on validation, ``translate.py --ref``, the benchmarks and the reports all call it, so their
numbers are measured the same way: the time covers tokenization, length-sorted batching, search and
detokenization (what a user of ``translate.py`` waits for), and the scores are sacreBLEU's
(:mod:`app.inference.metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from app.inference.engine import Engine, SearchSettings
from app.inference.metrics import Scores, SplitScores, corpus_scores, joined_scores


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
    split: SplitScores | None = None  # joined examples (data.concat): scores after splitting them

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
            **(self.split.rounded(prefix=prefix) if self.split else {}),
            f"{prefix}decode_seconds": speed["seconds"],
            f"{prefix}decode_sentences_per_s": speed["sentences_per_s"],
            f"{prefix}decode_tokens_per_s": speed["tokens_per_s"],
            f"{prefix}decode_threads": speed["threads"],
            f"{prefix}decode_device": speed["device"],
        }


def evaluate(
    engine: Engine,
    sources: list[str],
    references: list[str] | None,
    settings: SearchSettings,
    *,
    test_set: str = "test",
    moses_lang: str | None = None,
    warmup: bool = False,
    on_truncate: Callable[[int, int], None] | None = None,
    separator: str | None = None,
) -> Evaluation:
    """Translate ``sources`` with ``engine``, time it, and score against ``references``.

    The engine is loaded once by the caller (:func:`app.inference.engines.open_engine`), so a benchmark
    or a validation grid can time several settings without reloading. ``warmup`` first
    translates one batch untimed (allocator and kernel caches warm, as in a long-running server).
    ``moses_lang`` (the references' language, an ISO code) adds the Moses-tokenized lowercased BLEU to
    the scores; it is not ``settings.target_lang``, the language a multilingual model is asked for.
    ``separator`` (joined examples, ``data.concat``) scores the outputs with it removed and adds the
    sentence-level scores of the outputs that split like their references.
    Reference counts that differ from the source count raise ValueError before anything is translated.
    """
    if references is not None and len(references) != len(sources):
        raise ValueError(f"{len(sources)} source sentences but {len(references)} references")
    if warmup:
        engine.translate(sources[: settings.batch_size], settings)
    hypotheses, seconds = timed_translation(engine, sources, settings, on_truncate)
    scores, split = None, None
    if references is not None and separator:
        scores, split = joined_scores(hypotheses, references, separator, moses_lang)
    elif references is not None:
        scores = corpus_scores(hypotheses, references, moses_lang)
    return Evaluation(
        checkpoint=engine.source,
        test_set=test_set,
        settings=settings,
        hypotheses=hypotheses,
        scores=scores,
        seconds=seconds,
        target_tokens=sum(len(ids) for ids in engine.tgt_tokenizer.encode(hypotheses)),
        threads=torch.get_num_threads(),
        device=str(engine.device),
        split=split,
    )


def timed_translation(
    engine: Engine,
    sources: list[str],
    settings: SearchSettings,
    on_truncate: Callable[[int, int], None] | None = None,
) -> tuple[list[str], float]:
    """Translations of ``sources`` and the seconds they took (GPU work finished before the clock stops)."""
    synchronize(engine.device)
    started = time.perf_counter()
    hypotheses = engine.translate(sources, settings, on_truncate=on_truncate)
    synchronize(engine.device)
    return hypotheses, time.perf_counter() - started


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
