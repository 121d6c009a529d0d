"""Deterministic synthetic parallel corpora of any size, grown from a real one (for scale benchmarks).

Pair ``i`` of an ``n``-pair corpus is pair ``i % len(base)`` of the base corpus; every copy after the
first is perturbed -- each side independently loses words (word dropout) and has two words swapped --
so that sentencepiece sees realistic text and length statistics stay close to the base corpus while
lines are not mere repeats. The random draws are seeded per block of lines, so the corpus depends
only on ``(base, n, seed)`` and can be written by streaming, never held in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["SyntheticCorpus", "perturb", "synthetic_pairs", "write_synthetic_corpus"]

_BLOCK = 10_000  # lines per independently seeded block
_FORMAT = 1  # bump when the generator changes: part of the stamp that lets an unchanged corpus be reused


@dataclass(frozen=True)
class SyntheticCorpus:
    """The written files and what made them."""

    src: Path
    tgt: Path
    pairs: int


def _read(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def perturb(sentence: str, rng: np.random.Generator, *, drop: float = 0.1) -> str:
    """``sentence`` with each word dropped with probability ``drop`` (at least one kept) and two swapped."""
    words = sentence.split(" ")
    if len(words) < 2:
        return sentence
    kept = [word for word, gone in zip(words, rng.random(len(words)) < drop, strict=True) if not gone]
    words = kept or words[:1]
    if len(words) >= 2:
        i, j = rng.choice(len(words), size=2, replace=False)
        words[i], words[j] = words[j], words[i]
    return " ".join(words)


def synthetic_pairs(
    src: Sequence[str], tgt: Sequence[str], pairs: int, *, seed: int = 0
) -> Iterator[tuple[str, str]]:
    """The ``pairs`` (source, target) lines of the corpus grown from ``src`` / ``tgt`` (see module doc)."""
    if len(src) != len(tgt) or not src:
        raise ValueError(f"the base corpus must be non-empty and aligned, got {len(src)} / {len(tgt)} lines")
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    for block_start in range(0, pairs, _BLOCK):
        rng = np.random.default_rng([seed, block_start // _BLOCK])
        for i in range(block_start, min(block_start + _BLOCK, pairs)):
            base = i % len(src)
            if i < len(src):
                yield src[base], tgt[base]
            else:
                yield perturb(src[base], rng), perturb(tgt[base], rng)


def write_synthetic_corpus(
    src_path: str | os.PathLike[str],
    tgt_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    pairs: int,
    *,
    seed: int = 0,
) -> SyntheticCorpus:
    """Write ``train.src`` / ``train.tgt`` of ``pairs`` lines grown from the base files into ``out_dir``.

    A ``stamp.json`` records the base files' hash, ``pairs``, ``seed`` and the generator version; an
    existing corpus with the same stamp is reused instead of being written again.
    """
    base_src, base_tgt = _read(Path(src_path)), _read(Path(tgt_path))
    out = Path(out_dir)
    corpus = SyntheticCorpus(src=out / "train.src", tgt=out / "train.tgt", pairs=pairs)
    digest = hashlib.sha256("\n".join([*base_src, "\0", *base_tgt]).encode("utf-8")).hexdigest()
    stamp = {"format": _FORMAT, "base": digest, "pairs": pairs, "seed": seed}
    stamp_path = out / "stamp.json"
    if stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        return corpus
    out.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)
    with corpus.src.open("w", encoding="utf-8") as src_out, corpus.tgt.open("w", encoding="utf-8") as tgt_out:
        for src_line, tgt_line in synthetic_pairs(base_src, base_tgt, pairs, seed=seed):
            src_out.write(src_line + "\n")
            tgt_out.write(tgt_line + "\n")
    stamp_path.write_text(json.dumps(stamp) + "\n")
    return corpus
