"""Two inference engines behind one interface: our PyTorch model, or its CTranslate2 export.

Both take raw sentences and give, per sentence, a list of :class:`Translation` (n-best or samples, best
first) with the same guarantees as ``translate.py``: input order kept, a blank sentence gives one empty
translation, an over-long source is truncated to the model's limit (reported), never dropped.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from app.data.tokenizer import Tokenizer
from app.decoding import Hypothesis, output_limits
from app.inference.translator import (
    SearchSettings,
    Translator,
    encode_sources,
    length_sorted_batches,
    load_translator,
    pad_batch,
)

ENGINES = ("torch", "ct2")
Truncated = Callable[[int, int], None]  # (index in the batch, source length in subwords)


@dataclass
class Translation:
    """One output for one input sentence."""

    text: str
    score: float  # ranking score: summed log-probability (over the length penalty in beam search)
    token_scores: list[float]  # log-probability of each output subword, then of EOS
    alignment: list[tuple[int, int]] | None = None  # (target, source) subword pairs; torch engine only


class Engine(ABC):
    """Sentences in, ranked translations out."""

    name: str
    max_source_tokens: int
    tgt_tokenizer: Tokenizer  # counts output tokens for speed figures
    device: torch.device = torch.device("cpu")

    @abstractmethod
    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        """``settings.nbest`` translations per sentence, best first; ``details`` adds per-token scores
        (and, where the engine can, alignments), which cost extra work."""

    def translate(
        self, sentences: list[str], settings: SearchSettings, on_truncate: Truncated | None = None
    ) -> list[str]:
        """The best translation of each sentence (the ``translate.py`` text output)."""
        return [hyps[0].text for hyps in self.translate_nbest(sentences, settings, on_truncate)]


def split_blank(sentences: list[str]) -> list[int]:
    """Indices of the sentences with something to translate."""
    return [i for i, s in enumerate(sentences) if s.strip()]


def fill_blank(count: int, todo: list[int], found: list[list[Translation]]) -> list[list[Translation]]:
    """Results for all ``count`` sentences: ``found`` at ``todo``, one empty translation elsewhere."""
    results = [[Translation(text="", score=0.0, token_scores=[])] for _ in range(count)]
    for index, hyps in zip(todo, found, strict=True):
        results[index] = hyps
    return results


class TorchEngine(Engine):
    """Our own model and search (app/decoding), from a checkpoint."""

    name = "torch"

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.max_source_tokens = translator.max_source_tokens
        self.tgt_tokenizer = translator.tgt_tokenizer

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.translator.device

    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        todo = split_blank(sentences)
        sources = self.translator.encode_sources(
            [sentences[i] for i in todo],
            on_truncate=(lambda j, n: on_truncate(todo[j], n)) if on_truncate else None,
        )
        found = self.translator.hypotheses(sources, settings)
        decode = self.translator.tgt_tokenizer.decode
        results = []
        for source, hyps in zip(sources, found, strict=True):
            texts = decode([h.tokens for h in hyps])
            results.append(
                [
                    Translation(text, h.score, h.token_scores, self.alignment(source, h) if details else None)
                    for text, h in zip(texts, hyps, strict=True)
                ]
            )
        return fill_blank(len(sentences), todo, results)

    def alignment(self, source: list[int], hyp: Hypothesis) -> list[tuple[int, int]] | None:
        """Each output subword's most attended source subword (last decoder layer, mean over heads)."""
        if not hyp.tokens:
            return []
        try:
            weights = self.translator.attention_map(source, hyp.tokens).weights  # (T+1, S), EOS rows last
        except ValueError:  # a model family or kernel without attention weights
            return None
        return [(t, int(s)) for t, s in enumerate(weights[: len(hyp.tokens)].argmax(dim=-1).tolist())]


class CT2Engine(Engine):
    """A model exported with ``scripts/export.py --format ct2``, run by CTranslate2.

    Decodes in the same length-sorted batches with the same per-sentence output limits as the torch
    engine: CTranslate2 takes one limit per call, so each output is cut at its own limit afterwards.
    """

    name = "ct2"

    def __init__(self, model_dir: str | os.PathLike[str], *, device: str = "cpu", threads: int = 0) -> None:
        import ctranslate2

        from app.export.ct2 import METADATA_FILE, SRC_SPM, TGT_SPM

        directory = Path(model_dir)
        self.metadata: dict[str, Any] = json.loads((directory / METADATA_FILE).read_text())
        self.src_tokenizer = Tokenizer.from_file(directory / SRC_SPM)
        self.tgt_tokenizer = Tokenizer.from_file(directory / TGT_SPM)
        self.max_positions = int(self.metadata["max_positions"])
        self.max_source_tokens = self.max_positions - 1
        self.model = ctranslate2.Translator(
            str(directory), device=device, compute_type="default", intra_threads=threads
        )
        pieces = self.tgt_tokenizer.id_to_piece(list(range(self.tgt_tokenizer.vocab_size)))
        self.piece_id = {piece: index for index, piece in enumerate(pieces)}
        banned = (self.tgt_tokenizer.pad_id, self.tgt_tokenizer.bos_id)  # never produced, as in torch
        self.banned = [[pieces[i]] for i in banned]

    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        todo = split_blank(sentences)
        sources = encode_sources(
            self.src_tokenizer,
            [sentences[i] for i in todo],
            self.max_source_tokens,
            (lambda j, n: on_truncate(todo[j], n)) if on_truncate else None,
        )
        found: list[list[Translation]] = [[] for _ in sources]
        for batch_ids in length_sorted_batches(sources, settings.batch_size):
            batch = [sources[i] for i in batch_ids]
            for index, hyps in zip(batch_ids, self.search(batch, settings, details), strict=True):
                found[index] = hyps
        return fill_blank(len(sentences), todo, found)

    def search(
        self, batch: list[list[int]], settings: SearchSettings, details: bool
    ) -> list[list[Translation]]:
        """Translations of source ids ``batch`` (each with EOS) through ``translate_batch``."""
        import ctranslate2

        limits = output_limits(
            pad_batch(batch, self.src_tokenizer.pad_id),
            self.src_tokenizer.pad_id,
            max_len=min(settings.max_len, self.max_positions),
            ratio=settings.len_ratio,
            extra=settings.len_extra,
        ).tolist()
        options: dict[str, Any] = {
            "beam_size": settings.beam,
            "num_hypotheses": settings.nbest,
            "length_penalty": settings.alpha,
            "max_decoding_length": max(limits),
            "return_scores": True,
            "suppress_sequences": self.banned,
        }
        if settings.sampling is not None:
            ctranslate2.set_random_seed(settings.sampling.seed)
            sampling = settings.sampling
            options.update(
                beam_size=1,
                sampling_topk=sampling.top_k or 0,
                sampling_topp=sampling.top_p,
                sampling_temperature=sampling.temperature,
            )
        pieces = [self.src_tokenizer.id_to_piece(ids) for ids in batch]
        results = self.model.translate_batch(pieces, **options)
        outputs = []
        for src, limit, result in zip(pieces, limits, results, strict=True):
            cut = [hyp[: limit - 1] for hyp in result.hypotheses]  # the torch engine forces EOS at its limit
            token_scores = self.token_scores(src, cut) if details else [[] for _ in cut]
            texts = self.tgt_tokenizer.decode([self.piece_ids(hyp) for hyp in cut])
            outputs.append(
                [
                    Translation(text, float(score), scores)
                    for text, score, scores in zip(texts, result.scores, token_scores, strict=True)
                ]
            )
        return outputs

    def piece_ids(self, pieces: list[str]) -> list[int]:
        return [self.piece_id.get(p, self.tgt_tokenizer.unk_id) for p in pieces]

    def token_scores(self, source: list[str], hyps: list[list[str]]) -> list[list[float]]:
        """Per-token log-probabilities (EOS last) of each hypothesis, read back with ``score_batch``."""
        results = self.model.score_batch([source] * len(hyps), hyps)
        return [list(r.log_probs) for r in results]


def choose_engine(path: str | os.PathLike[str], engine: str | None) -> str:
    """The engine for ``path``: as asked, else ``ct2`` for an exported directory and ``torch`` otherwise."""
    from app.export.ct2 import is_ct2_model_dir

    if engine is None:
        return "ct2" if is_ct2_model_dir(path) else "torch"
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    return engine


def open_engine(
    path: str | os.PathLike[str],
    *,
    engine: str | None = None,
    device: str = "cpu",
    threads: int = 0,
    ensemble: list[str] | None = None,
) -> Engine:
    """Load ``path`` (a checkpoint, or a CTranslate2 directory) into the chosen engine.

    ``threads`` > 0 sets the CPU threads once, here (torch's intra-op pool, CTranslate2's intra_threads).
    ``ensemble`` checkpoints decode together with ``path`` (torch engine; see :class:`Ensemble`).
    """
    from app.export.ct2 import is_ct2_model_dir

    chosen = choose_engine(path, engine)
    if ensemble and chosen != "torch":
        raise ValueError(f"--ensemble needs the torch engine and .ckpt checkpoints, got {path} ({chosen})")
    if chosen == "ct2":
        if not is_ct2_model_dir(path):
            raise ValueError(
                f"--engine ct2 needs a directory written by scripts/export.py --format ct2, got {path}"
            )
        return CT2Engine(path, device=device, threads=threads)
    if Path(path).is_dir():
        raise ValueError(f"--engine torch needs a .ckpt checkpoint, got the directory {path}")
    if threads > 0:
        torch.set_num_threads(threads)
    translator, _ = load_translator(path, device=device, ensemble=ensemble or ())
    return TorchEngine(translator)
