"""Corpus-level scores with sacreBLEU: cased and lowercased BLEU (13a tokenization), and chrF.

With the target language known, also the score most Multi30k papers report (e.g. Wu et al. 2021):
BLEU on lowercased text tokenized with the Moses tokenizer (``sacremoses``), references tokenized the
same way, as ``multi-bleu.perl -lc`` computes it on tokenized files. It is not comparable with
detokenized sacreBLEU: Moses splits more (apostrophes, hyphens), so the same output usually scores higher.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesTokenizer

from app.data.concat import split_at_separator


@dataclass(frozen=True)
class Scores:
    bleu: float  # cased, detokenized BLEU
    bleu_lc: float  # lowercased BLEU, as most Multi30k papers report
    chrf: float
    signature: str  # sacreBLEU signature of the cased BLEU, for reproducibility
    bleu_moses_lc: float | None = None  # lowercased BLEU on Moses tokens (None: target language unknown)

    def rounded(self, prefix: str = "") -> dict[str, float | str]:
        values = {"bleu": self.bleu, "bleu_lc": self.bleu_lc, "chrf": self.chrf}
        if self.bleu_moses_lc is not None:
            values["bleu_moses_lc"] = self.bleu_moses_lc
        return {f"{prefix}{k}": round(v, 2) for k, v in values.items()} | {
            f"{prefix}signature": self.signature
        }


def corpus_scores(hypotheses: list[str], references: list[str], moses_lang: str | None = None) -> Scores:
    """Score detokenized hypotheses against one reference each; ``moses_lang`` (the references' language,
    an ISO code) adds the Moses-tokenized lowercased BLEU."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    refs = [references]
    bleu = BLEU()
    cased = bleu.corpus_score(hypotheses, refs).score
    return Scores(
        bleu=cased,
        bleu_lc=BLEU(lowercase=True).corpus_score(hypotheses, refs).score,
        chrf=CHRF().corpus_score(hypotheses, refs).score,
        signature=str(bleu.get_signature()),
        bleu_moses_lc=moses_bleu_lc(hypotheses, references, moses_lang) if moses_lang else None,
    )


@dataclass(frozen=True)
class SplitScores:
    """Sentence-level scores of joined examples (``data.concat``), split back at their separators.

    Only the examples whose translation kept as many separators as its reference can be split
    sentence for sentence; the others are counted, not scored.
    """

    examples: int  # joined examples in the test set
    matched: int  # of those, split into as many sentences as their references
    sentences: int  # sentences scored (from the matched examples)
    scores: Scores | None  # None when no example matched

    def rounded(self, prefix: str = "") -> dict[str, float | str | int]:
        counts = {"examples": self.examples, "matched": self.matched, "sentences": self.sentences}
        scores = self.scores.rounded(prefix=f"{prefix}sentence_") if self.scores else {}
        return {f"{prefix}split_{k}": v for k, v in counts.items()} | scores


def joined_scores(
    hypotheses: list[str], references: list[str], separator: str, moses_lang: str | None = None
) -> tuple[Scores, SplitScores]:
    """Scores of joined examples: the whole outputs with the separators removed (so matching them earns
    nothing), and sentence-level scores where an output splits like its reference."""
    whole = corpus_scores(
        [" ".join(split_at_separator(h, separator)) for h in hypotheses],
        [" ".join(split_at_separator(r, separator)) for r in references],
        moses_lang,
    )
    hyps: list[str] = []
    refs: list[str] = []
    matched = 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        hyp_parts, ref_parts = (
            split_at_separator(hypothesis, separator),
            split_at_separator(reference, separator),
        )
        if len(hyp_parts) == len(ref_parts):
            hyps += hyp_parts
            refs += ref_parts
            matched += 1
    sentence = corpus_scores(hyps, refs, moses_lang) if hyps else None
    return whole, SplitScores(len(hypotheses), matched, len(hyps), sentence)


def moses_bleu_lc(hypotheses: list[str], references: list[str], lang: str) -> float:
    """Lowercased BLEU on Moses-tokenized text (no further tokenization by sacreBLEU)."""
    tokenize = moses_tokenizer(lang)
    hyps = [tokenize(h) for h in hypotheses]
    refs = [[tokenize(r) for r in references]]
    return BLEU(lowercase=True, tokenize="none", force=True).corpus_score(hyps, refs).score


@lru_cache(maxsize=8)
def moses_tokenizer(lang: str) -> Callable[[str], str]:
    """The Moses tokenizer for ``lang`` as str -> str; XML escaping off (the text is not XML)."""
    tokenizer = MosesTokenizer(lang=lang)
    return lambda text: tokenizer.tokenize(text, escape=False, return_str=True)
