"""The CTranslate2 engine: a model exported with ``scripts/export.py --format ct2``, sentences in,
sentences out, with the torch engine's batching, limits and order (:mod:`app.inference.torch_engine`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from app.data.multilingual import Languages
from app.data.tokenizer import Tokenizer
from app.decoding import output_limits
from app.decoding.beam import length_penalty
from app.export.ct2 import METADATA_FILE, SRC_SPM, TGT_SPM
from app.inference.engine import (
    Engine,
    SearchSettings,
    Translation,
    Truncated,
    fill_blank,
    on_subset,
    split_blank,
)
from app.inference.torch_engine import encode_sources, length_sorted_batches, pad_batch


class CT2Engine(Engine):
    """A model exported with ``scripts/export.py --format ct2``, run by CTranslate2.

    Decodes in the same length-sorted batches with the same per-sentence output limits as the torch
    engine: CTranslate2 takes one limit per call, so each output is cut at its own limit afterwards.
    A multilingual export's languages come from its metadata; the target-language tag is a source
    token (:class:`~app.inference.languages.TaggedEngine` adds it), so no ``target_prefix`` is needed.
    """

    name = "ct2"

    def __init__(self, model_dir: str | os.PathLike[str], *, device: str = "cpu", threads: int = 0) -> None:
        import ctranslate2  # an optional dependency (the ``serve`` extra): imported where it is used

        directory = Path(model_dir)
        self.source = str(directory)
        self.metadata: dict[str, Any] = json.loads((directory / METADATA_FILE).read_text())
        self.src_tokenizer = Tokenizer.from_file(directory / SRC_SPM)
        self.tgt_tokenizer = Tokenizer.from_file(directory / TGT_SPM)
        self.max_positions = int(self.metadata["max_positions"])
        self.max_source_tokens = self.max_positions - 1
        self.languages = Languages.from_config(self.metadata.get("config") or {})
        self.model = ctranslate2.Translator(
            str(directory), device=device, compute_type="default", intra_threads=threads
        )
        pieces = self.tgt_tokenizer.id_to_piece(list(range(self.tgt_tokenizer.vocab_size)))
        self.piece_id = {piece: index for index, piece in enumerate(pieces)}
        banned = (self.tgt_tokenizer.pad_id, self.tgt_tokenizer.bos_id)  # never produced, as in torch
        self.banned = [[pieces[i]] for i in banned]
        self.length_norm = ((self.metadata.get("config") or {}).get("test_search") or {}).get("length_norm")

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
            on_subset(todo, on_truncate),
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
        beam = settings.sampling is None and settings.beam > 1
        options: dict[str, Any] = {  # a beam's finished hypotheses all come back, raw, to be ranked here
            "beam_size": settings.beam,
            "num_hypotheses": settings.beam if beam else settings.nbest,
            "length_penalty": 0.0,
            "max_decoding_length": max(limits),
            "min_decoding_length": 0,  # EOS first is an empty translation, as in torch (CT2's default: 1)
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
            ranked = self.ranked(result, settings) if beam else self.unranked(result)
            cut = [hyp[: limit - 1] for hyp, _ in ranked]  # the torch engine forces EOS at its limit
            token_scores = self.token_scores(src, cut) if details else [[] for _ in cut]
            texts = self.tgt_tokenizer.decode([self.piece_ids(hyp) for hyp in cut])
            outputs.append(
                [
                    Translation(text, float(score), scores)
                    for text, (_, score), scores in zip(texts, ranked, token_scores, strict=True)
                ]
            )
        return outputs

    @staticmethod
    def unranked(result: Any) -> list[tuple[list[str], float]]:
        """Greedy or sampled hypotheses with CTranslate2's scores (summed log-probabilities)."""
        return list(zip(result.hypotheses, result.scores, strict=True))

    def ranked(self, result: Any, settings: SearchSettings) -> list[tuple[list[str], float]]:
        """The ``nbest`` best of a beam's finished hypotheses, scored as the torch engine scores them:
        summed log-probability over :func:`~app.decoding.beam.length_penalty` of the settings' (else the
        model's) length norm, EOS counted. CTranslate2 knows only |Y| ** alpha, so it returns them raw
        (``length_penalty=0``): both searches keep the K best raw scores and stop at K finished
        hypotheses, so only the final ranking depends on the norm."""
        norm = settings.length_norm or self.length_norm or "gnmt"
        scored = [
            (hyp, float(raw) / float(length_penalty(len(hyp) + 1, settings.alpha, norm)))
            for hyp, raw in self.unranked(result)
        ]
        return sorted(scored, key=lambda pair: -pair[1])[: settings.nbest]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        return [self.piece_id.get(p, self.tgt_tokenizer.unk_id) for p in pieces]

    def token_scores(self, source: list[str], hyps: list[list[str]]) -> list[list[float]]:
        """Per-token log-probabilities (EOS last) of each hypothesis, read back with ``score_batch``."""
        results = self.model.score_batch([source] * len(hyps), hyps)
        return [list(r.log_probs) for r in results]
