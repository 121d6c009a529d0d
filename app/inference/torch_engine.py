"""The torch engine: our model and search, sentences in, sentences out.

Tokenization, batching by length, search (app/decoding), detokenization. Used by validation during
training and, as an :class:`~app.inference.engine.Engine`, by everything that translates. Order is always
kept, an empty input gives an empty output, and a source longer than the model accepts is truncated
(reported through ``on_truncate``), never dropped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from app.acceleration.auto import Decoding, FixedDecoding, decoding_for
from app.acceleration.packed_linear import pack_wide_linears
from app.acceleration.weight_layout import store_column_major
from app.attention.multihead import MultiHeadAttention
from app.checkpoint import CheckpointError, LoadedModel, load_model
from app.data.tokenizer import Tokenizer
from app.decoding import (
    Hypothesis,
    beam_hypotheses,
    greedy_hypotheses,
    output_limits,
    sample_search,
)
from app.inference.allocator import keep_freed_memory
from app.inference.engine import (
    AttentionMap,
    Engine,
    SearchSettings,
    Translation,
    Truncated,
    fill_blank,
    on_subset,
    split_blank,
)
from app.models.ensemble import Ensemble
from app.models.seq2seq import Seq2Seq

PathLike = str | os.PathLike[str]


class TorchEngine(Engine):
    """A trained model with its tokenizers, ready to translate text: the torch engine."""

    name = "torch"

    def __init__(
        self,
        model: Seq2Seq,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        *,
        source: str = "<in memory>",
    ) -> None:
        self.model = model
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.source = source
        self.compile_mode = "off"
        self.length_norm = "gnmt"  # beam search's default length_norm (SearchSettings.length_norm None)
        self.decoding: Decoding = FixedDecoding(model, "off")  # which model each batch searches with

    @property
    def has_attention_maps(self) -> bool:  # type: ignore[override]
        """Whether every cross-attention kernel gives weights: linear and Linformer attention have none,
        so their maps are refused before any decoding (recurrent models' mechanisms always give them)."""
        return all(
            module.kernel.capabilities.returns_weights
            for name, module in self.model.named_modules()
            if isinstance(module, MultiHeadAttention) and name.endswith("cross_attn")
        )

    def compile(self, mode: str) -> None:
        """Decode through AOTInductor packages: ``mode`` auto | aot | off (see :mod:`app.acceleration.auto`);
        where they cannot be used, decoding stays eager."""
        self.compile_mode = mode
        self.decoding = decoding_for(self.model, mode)

    def compile_report(self) -> str | None:
        """How decoding ran: packages and the seconds they took (once per process), or why it was eager."""
        return self.decoding.report()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_source_tokens(self) -> int:
        """Subword tokens a source may have before EOS is appended."""
        return self.model.max_positions - 1

    def encode_sources(self, sentences: list[str], on_truncate: Truncated | None = None) -> list[list[int]]:
        """Source ids with EOS, truncated to the model's limit (``on_truncate(index, length)``)."""
        return encode_sources(self.src_tokenizer, sentences, self.max_source_tokens, on_truncate)

    def translate(
        self, sentences: list[str], settings: SearchSettings, on_truncate: Truncated | None = None
    ) -> list[str]:
        """One translation per sentence, in order; blank sentences translate to ''."""
        outputs = [""] * len(sentences)
        todo = split_blank(sentences)
        sources = self.encode_sources([sentences[i] for i in todo], on_subset(todo, on_truncate))
        hyps = self.translate_ids(sources, settings)
        for index, text in zip(todo, self.tgt_tokenizer.decode(hyps), strict=True):
            outputs[index] = text
        return outputs

    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        """``settings.nbest`` translations per sentence, best first; ``details`` adds alignments."""
        todo = split_blank(sentences)
        sources = self.encode_sources([sentences[i] for i in todo], on_subset(todo, on_truncate))
        results = []
        for source, hyps in zip(sources, self.hypotheses(sources, settings), strict=True):
            texts = self.tgt_tokenizer.decode([h.tokens for h in hyps])
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
            weights = self.attention_map(source, hyp.tokens).weights  # (T+1, S), EOS rows last
        except ValueError:  # a model family or kernel without attention weights
            return None
        return [(t, int(s)) for t, s in enumerate(weights[: len(hyp.tokens)].argmax(dim=-1).tolist())]

    @torch.no_grad()
    def attention_maps(
        self,
        sentences: list[str],
        settings: SearchSettings,
        *,
        layer: int | None = None,
        head: int | None = None,
        on_truncate: Truncated | None = None,
    ) -> list[AttentionMap | None]:
        """Translations with their attention maps, in order; None for blank sentences.

        The output is searched as in :meth:`translate`, then re-read with teacher forcing to collect the
        weights: ``layer`` / ``head`` as in :meth:`~app.models.seq2seq.Seq2Seq.cross_attention`.
        """
        todo = split_blank(sentences)
        sources = self.encode_sources([sentences[i] for i in todo], on_subset(todo, on_truncate))
        hyps = self.translate_ids(sources, settings)
        maps: list[AttentionMap | None] = [None] * len(sentences)
        for index, source, hyp in zip(todo, sources, hyps, strict=True):
            maps[index] = self.attention_map(source, hyp, layer=layer, head=head)
        return maps

    @torch.no_grad()
    def attention_map(
        self, source: list[int], hyp: list[int], *, layer: int | None = None, head: int | None = None
    ) -> AttentionMap:
        """The map of one source (ids incl. EOS) and its output ``hyp`` (ids without BOS/EOS)."""
        tok = self.tgt_tokenizer
        src = torch.tensor([source], dtype=torch.long, device=self.device)
        tgt_in = torch.tensor([[tok.bos_id, *hyp]], dtype=torch.long, device=self.device)
        with evaluating(self.model):
            weights = (
                self.model.cross_attention(src, tgt_in, layer=layer, head=head)[0].float().cpu()
            )  # (T, S)
        return AttentionMap(
            translation=tok.decode([hyp])[0],
            source_tokens=self.src_tokenizer.id_to_piece(source),
            target_tokens=tok.id_to_piece([*hyp, tok.eos_id]),
            weights=weights,
        )

    def translate_ids(self, sources: list[list[int]], settings: SearchSettings) -> list[list[int]]:
        """The best output ids of every source (ids incl. EOS), in input order."""
        return [hyps[0].tokens for hyps in self.hypotheses(sources, settings)]

    @torch.inference_mode()
    def hypotheses(self, sources: list[list[int]], settings: SearchSettings) -> list[list[Hypothesis]]:
        """Search for every source (ids incl. EOS); batches of similar length, results in input order."""
        results: list[list[Hypothesis]] = [[] for _ in sources]
        left = len(sources)
        with evaluating(self.model):
            for batch_ids in length_sorted_batches(sources, settings.batch_size):
                src = pad_batch([sources[i] for i in batch_ids], self.src_tokenizer.pad_id).to(self.device)
                model = self.decoding.model_for(left, len(batch_ids), settings.beam)
                started = time.perf_counter()
                for index, hyps in zip(batch_ids, self.search(model, src, settings), strict=True):
                    results[index] = hyps
                self.decoding.record(model, len(batch_ids), time.perf_counter() - started)
                left -= len(batch_ids)
        return results

    def search(self, model: Seq2Seq, src: torch.Tensor, settings: SearchSettings) -> list[list[Hypothesis]]:
        """``settings.nbest`` hypotheses by ``model`` (this translator's, or it compiled), best first, for
        each row of ``src`` (B, S)."""
        tok = self.tgt_tokenizer
        limits = output_limits(
            src,
            self.src_tokenizer.pad_id,
            max_len=min(settings.max_len, self.model.max_positions),
            ratio=settings.len_ratio,
            extra=settings.len_extra,
        )
        common = {
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
            "limits": limits,
            "banned": (tok.pad_id, tok.bos_id),
        }
        if settings.sampling is not None:
            return self.sample(model, src, settings, common)
        if settings.beam == 1:
            return [[h] for h in greedy_hypotheses(model, src, **common)]
        return beam_hypotheses(
            model,
            src,
            beam_size=settings.beam,
            alpha=settings.alpha,
            nbest=settings.nbest,
            length_norm=settings.length_norm or self.length_norm,
            **common,
        )

    def sample(
        self, model: Seq2Seq, src: torch.Tensor, settings: SearchSettings, common: dict
    ) -> list[list[Hypothesis]]:
        """``nbest`` samples per row (each row repeated), sorted by score: one seeded draw per batch."""
        n = settings.nbest
        rows = torch.arange(src.size(0), device=src.device).repeat_interleave(n)
        common = {**common, "limits": common["limits"][rows]}
        drawn = sample_search(model, src[rows], settings.sampling, **common)
        return [sorted(drawn[i * n : (i + 1) * n], key=lambda h: -h.score) for i in range(src.size(0))]


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode meanwhile, its root's mode restored after. A model already in eval mode
    throughout is left alone: ``eval()`` walks every module (~1 ms for a Transformer, a few percent of a
    one-sentence translation)."""
    if not any(module.training for module in model.modules()):
        yield
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def load_torch_engine(
    path: PathLike,
    device: str | torch.device = "cpu",
    *,
    ensemble: Sequence[PathLike] = (),
    compile: str = "off",
) -> tuple[TorchEngine, dict]:
    """A ready :class:`TorchEngine` for checkpoint ``path`` on ``device``, and the run config stored in it.

    ``compile`` (auto | aot | off): decoding through AOTInductor packages, see :meth:`TorchEngine.compile`.
    With ``ensemble`` checkpoints, they decode together with ``path`` as one :class:`Ensemble` (their
    distributions averaged per token); all must share ``path``'s tokenizers, and the config is ``path``'s.
    """
    loaded = load_model(path, device)
    model: Seq2Seq = loaded.model
    if ensemble:
        members = [loaded.model]
        for other in ensemble:
            member = load_model(other, device)
            check_same_vocabulary(loaded, path, member, other)
            members.append(member.model)
        model = Ensemble(members).eval()
    if torch.device(device).type == "cpu":
        keep_freed_memory()  # large step tensors reuse the heap instead of fresh, page-faulted mappings
        store_column_major(model)  # decoding streams the weights: the layout GEMM reads fastest
        pack_wide_linears(model)  # and the wide linears through oneDNN from 2 rows up
    translator = TorchEngine(model, loaded.src_tokenizer, loaded.tgt_tokenizer, source=str(path))
    translator.length_norm = (loaded.config.get("test_search") or {}).get("length_norm") or "gnmt"
    translator.compile(compile)
    return translator, loaded.config


def check_same_vocabulary(
    first: LoadedModel, first_path: PathLike, other: LoadedModel, other_path: PathLike
) -> None:
    """Ensemble members must tokenize and detokenize identically (same sentencepiece models)."""
    for side in ("src_tokenizer", "tgt_tokenizer"):
        if getattr(first, side).to_bytes() != getattr(other, side).to_bytes():
            raise CheckpointError(
                f"cannot ensemble {first_path} and {other_path}: their {side.split('_')[0]} "
                f"sentencepiece models differ ({getattr(first, side).vocab_size} and "
                f"{getattr(other, side).vocab_size} pieces); members must share one vocabulary"
            )


def encode_sources(
    tokenizer: Tokenizer,
    sentences: list[str],
    limit: int,
    on_truncate: Truncated | None = None,
) -> list[list[int]]:
    """Source ids with EOS, cut to ``limit`` subwords first (reported as ``on_truncate(index, length)``)."""
    encoded = tokenizer.encode(sentences)
    for index, ids in enumerate(encoded):
        if len(ids) > limit:
            if on_truncate:
                on_truncate(index, len(ids))
            encoded[index] = ids[:limit]
    return [[*ids, tokenizer.eos_id] for ids in encoded]


def length_sorted_batches(sequences: list[list[int]], batch_size: int) -> Iterator[list[int]]:
    """Indices of ``sequences`` in batches of similar length (less padding, same results)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def pad_batch(sequences: list[list[int]], pad_id: int) -> torch.Tensor:
    """(B, max_len) long tensor, right-padded with ``pad_id``."""
    width = max(len(s) for s in sequences)
    batch = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        batch[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return batch
