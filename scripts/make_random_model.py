"""A randomly initialised Transformer checkpoint with a real sentencepiece model, in seconds.

    python scripts/make_random_model.py /tmp/bench_model/model.ckpt
    python scripts/export.py /tmp/bench_model/model.ckpt --format ct2 -o /tmp/bench_model/model_ct2

For measuring speed (serving, decoding) where no trained checkpoint is at hand: the shape of a small
translation model (d_model 256, 3+3 pre-norm layers, a 1,000-piece joint de+en sentencepiece trained on
the committed test fixture). Its weights are random, so its outputs are nonsense and rarely stop early:
each runs to the length cap (1.5 x source subwords + 10), a pessimistic but fixed amount of work.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from app.checkpoint import model_checkpoint, save_atomically  # noqa: E402
from app.data.subword_training import train_or_load  # noqa: E402
from app.data.tokenizer import SubwordConfig  # noqa: E402
from app.models import build_model  # noqa: E402

FIXTURE = REPO_ROOT / "tests" / "fixtures" / "multi30k"
MODEL = {
    "family": "transformer",
    "d_model": 256,
    "num_heads": 4,
    "encoder_layers": 3,
    "decoder_layers": 3,
    "d_ff": 1024,
    "dropout": 0.0,
    "pre_norm": True,  # CTranslate2 export needs pre-norm
    "tie_embeddings": True,
    "share_src_tgt_embeddings": True,
    "max_positions": 128,
}


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the .ckpt to write (its folder also holds the tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokenizer, _ = train_or_load(
        src_texts=read_lines(FIXTURE / "train.de.gz"),
        tgt_texts=read_lines(FIXTURE / "train.en.gz"),
        config=SubwordConfig(vocab_size=1000),
        cache_dir=args.output.parent / "spm",
        corpus_key="multi30k-fixture",
    )
    torch.manual_seed(args.seed)
    size = tokenizer.vocab_size
    attention = {"kernel": "sdpa"}
    model = build_model(MODEL, attention, src_vocab_size=size, tgt_vocab_size=size, pad_id=tokenizer.pad_id)
    config = {"model": MODEL, "attention": attention}
    save_atomically(model_checkpoint(model.eval(), config, tokenizer, tokenizer), args.output)
    print(f"wrote {args.output} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, random)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
