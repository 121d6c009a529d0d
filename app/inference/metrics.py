"""Corpus-level scores with sacreBLEU: cased and lowercased BLEU (13a tokenization), and chrF."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF


@dataclass(frozen=True)
class Scores:
    bleu: float  # cased, detokenized BLEU
    bleu_lc: float  # lowercased BLEU, as most Multi30k papers report
    chrf: float
    signature: str  # sacreBLEU signature of the cased BLEU, for reproducibility

    def rounded(self, prefix: str = "") -> dict[str, float | str]:
        values = {"bleu": self.bleu, "bleu_lc": self.bleu_lc, "chrf": self.chrf}
        return {f"{prefix}{k}": round(v, 2) for k, v in values.items()} | {
            f"{prefix}signature": self.signature
        }


def corpus_scores(hypotheses: list[str], references: list[str]) -> Scores:
    """Score detokenized hypotheses against one reference each."""
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
    )
