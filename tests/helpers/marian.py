"""A tiny random Marian (OPUS-MT layout) model directory, built with ``transformers`` offline.

Two small sentencepiece models trained on the fixture corpus (German source, English target), a joint
``vocab.json`` in Marian's layout (eos 0, unk 1, the pieces of both models, pad last) and a random
``MarianMTModel`` saved with ``save_pretrained``: what an OPUS-MT download holds, at a size a test builds in
about a second. ``separate=True`` builds the layout of the Tatoeba-Challenge ``opus-mt-tc-*`` models
instead: ``vocab.json`` for the source pieces, ``target_vocab.json`` for the target ones (each in Marian's
layout, so of different sizes), separate encoder and decoder embeddings. ``codes`` adds target-language
tokens (``>>fra<<``) to the source vocabulary, amid its pieces, as multilingual OPUS-MT models have them:
entries of ``vocab.json`` that no piece of ``source.spm`` is.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm
import torch
from helpers.training import REPO_ROOT, read_gz_lines

FIXTURE_DIR = REPO_ROOT / "tests" / "fixtures" / "multi30k"
SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau in einem roten Kleid singt auf einer Bühne.",
    "Kinder.",
]
LANGUAGE_CODES = (">>fra<<", ">>spa<<", ">>pt_BR<<")
TAGGED_SENTENCES = [  # as Hugging Face's users write them for a multilingual model
    ">>fra<< Ein Mann fährt Fahrrad.",
    ">>spa<< Zwei Hunde spielen im Schnee.",
    ">>pt_BR<< Eine Frau in einem roten Kleid singt auf einer Bühne.",
    ">>fra<< Kinder.",
]


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    """A unigram model with sentencepiece's own special ids (unk 0, bos 1, eos 2), as Marian's are."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
    )
    return model.getvalue()


def spm_pieces(model: bytes) -> list[str]:
    processor = spm.SentencePieceProcessor(model_proto=model)
    return [
        processor.id_to_piece(i)
        for i in range(processor.vocab_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def marian_vocab(pieces: list[str]) -> dict[str, int]:
    """A vocabulary in Marian's layout: eos 0, unk 1, ``pieces`` (duplicates once), padding last."""
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(dict.fromkeys(pieces))}}
    vocab["<pad>"] = len(vocab)
    return vocab


def make_marian_dir(
    directory: Path,
    *,
    seed: int = 0,
    separate: bool = False,
    codes: tuple[str, ...] = (),
    eos_bias: float | None = None,
) -> Path:
    """Write a random Marian model directory (config.json, model.safetensors, spms, vocab.json and, with
    ``separate``, target_vocab.json); ``codes`` go into the source vocabulary after its first 10 pieces.
    ``eos_bias``: EOS's logit bias (default 2.0, 2.1 separate), chosen per model so that its greedy and
    beam outputs end at varied lengths, some before a test's limit."""
    from transformers import MarianConfig, MarianMTModel

    directory.mkdir(parents=True, exist_ok=True)
    source = train_spm(read_gz_lines(FIXTURE_DIR / "train.de.gz", 600), 120)
    target = train_spm(read_gz_lines(FIXTURE_DIR / "train.en.gz", 600), 100)
    src_pieces = spm_pieces(source)
    src_pieces[10:10] = codes
    if separate:
        vocab, target_vocab = marian_vocab(src_pieces), marian_vocab(spm_pieces(target))
    else:
        vocab = target_vocab = marian_vocab(src_pieces + spm_pieces(target))
    # The decoder starts from pad_token_id, the target vocabulary's padding: Hugging Face has one pad id
    # for both embeddings, so it must lie in both (here the source vocabulary is the larger one).
    size, pad = len(vocab), target_vocab["<pad>"]
    assert pad < size
    config = MarianConfig(
        vocab_size=size,
        decoder_vocab_size=len(target_vocab),
        share_encoder_decoder_embeddings=not separate,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=64,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        init_std=0.2,  # ten times the default: logits that depend on the input, not on the bias alone
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():  # trained-looking norms and logit biases, not the identity init
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
        model.final_logits_bias.normal_(0.0, 0.5)
        # EOS likely enough that outputs end before their limits (the separate model: some at once, an
        # empty translation, which the CTranslate2 engine must allow too)
        model.final_logits_bias[0, 0] = eos_bias or (2.1 if separate else 2.0)
        model.final_logits_bias[0, pad] = 0.0  # the padding's bias stays zero, as in OPUS-MT
    model.save_pretrained(directory)
    (directory / "source.spm").write_bytes(source)
    (directory / "target.spm").write_bytes(target)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    if separate:
        text = json.dumps(target_vocab, ensure_ascii=False)
        (directory / "target_vocab.json").write_text(text, encoding="utf-8")
    return directory
