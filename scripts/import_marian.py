"""Import a Marian / OPUS-MT model (a Hugging Face model directory) as a checkpoint of this toolkit.

    python scripts/import_marian.py opus-mt-de-en -o opus-mt-de-en.ckpt
    python scripts/import_marian.py DIR -o model.ckpt --src-lang de --tgt-lang en
    python scripts/import_marian.py --from-hub Helsinki-NLP/opus-mt-de-en -o model.ckpt   # needs network

The checkpoint translates (translate.py, scripts/serve.py), exports (scripts/export.py --format ct2) and
fine-tunes (train.py init_from=, with the overrides printed here) like one trained here. DIR holds
config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm and vocab.json, and
target_vocab.json where the model has separate source and target vocabularies (opus-mt-tc-* models).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.checkpoint import CheckpointError, save_atomically
from app.interop.marian import import_marian
from app.interop.marian_files import check_marian_dir, download, languages_from_name


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", help="a Hugging Face Marian model directory")
    parser.add_argument("--from-hub", metavar="NAME", help="download NAME from the Hugging Face hub first")
    parser.add_argument("-o", "--output", required=True, help="the checkpoint to write (.ckpt)")
    parser.add_argument("--src-lang", help="source language (default: from an opus-mt-SRC-TGT name)")
    parser.add_argument("--tgt-lang", help="target language (default: from an opus-mt-SRC-TGT name)")
    args = parser.parse_args(argv)
    if (args.directory is None) == (args.from_hub is None):
        parser.error("give a model directory or --from-hub NAME (one of them)")
    return args


def convert(args: argparse.Namespace, directory: Path) -> int:
    check_marian_dir(directory)
    found = languages_from_name(args.from_hub or directory)
    src, tgt = args.src_lang or (found and found[0]), args.tgt_lang or (found and found[1])
    if not src or not tgt:
        raise ValueError(
            f"cannot tell the languages from the name {directory.name!r} (not opus-mt-SRC-TGT): "
            "give --src-lang and --tgt-lang"
        )
    imported = import_marian(directory, src_lang=src, tgt_lang=tgt)
    save_atomically(imported.checkpoint, args.output)
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {args.output} ({src}->{tgt}); translate with: python translate.py {args.output}")
    overrides = " ".join(shlex.quote(override) for override in imported.overrides)
    print(f"fine-tune with: python train.py {overrides} init_from={args.output} data=...")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.from_hub:
            with tempfile.TemporaryDirectory() as tmp:
                return convert(args, download(args.from_hub, Path(tmp) / args.from_hub.split("/")[-1]))
        return convert(args, Path(args.directory))
    except (CheckpointError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
