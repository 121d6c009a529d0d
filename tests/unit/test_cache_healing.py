"""Caches that heal: a token cache or a cached sentencepiece model that fails to load, or no longer
matches the checksum recorded for it, is moved aside and rebuilt, with a warning naming it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import pytest
from helpers.training import read_gz_lines

from app.data.corpus import open_parallel
from app.data.encoded import encode_split
from app.data.subword_training import train_or_load
from app.data.tokenizer import SubwordConfig, Tokenizer

SRC = ["Ein Hund läuft.", "Zwei Männer spielen Fußball im Park.", "Eine Frau.", "Kinder"] * 50
TGT = ["A dog runs.", "Two men play football in the park.", "A woman.", "Children playing"] * 50


@pytest.fixture
def corpus(tmp_path: Path) -> datasets.Dataset:
    for name, lines in (("c.de", SRC), ("c.en", TGT)):
        (tmp_path / name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return open_parallel(tmp_path / "c.de", tmp_path / "c.en", cache_dir=tmp_path / "hf")


def build(corpus: datasets.Dataset, tokenizer: Tokenizer, cache: Path) -> tuple[Path, list[list[int]]]:
    encoded = encode_split(corpus, tokenizer, tokenizer, cache_dir=cache)
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    return entry, encoded.data.column("src_ids").to_pylist()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_byte(path: Path) -> None:
    """Same size, one byte changed inside the id values: only a checksum notices."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def drop_checksums(entry: Path) -> None:
    """A manifest as written before sizes and checksums were recorded."""
    manifest = json.loads((entry / "manifest.json").read_text())
    (entry / "manifest.json").write_text(json.dumps({k: manifest[k] for k in ("format", "rows", "files")}))


@pytest.mark.parametrize(
    "damage",
    [
        truncate,
        flip_a_byte,
        lambda path: (drop_checksums(path.parent), truncate(path)),
        lambda path: path.unlink(),
    ],
    ids=["truncated", "bit_flip", "truncated_old_manifest", "missing_file"],
)
def test_a_damaged_token_cache_is_moved_aside_and_rebuilt(
    corpus: datasets.Dataset,
    spm_tokenizer: Tokenizer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage,
) -> None:
    cache = tmp_path / "tokens"
    entry, expected = build(corpus, spm_tokenizer, cache)
    damage(entry / "ids.arrow")
    with caplog.at_level(logging.WARNING, logger="app.data.encoded"):
        again = encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=cache)
    assert again.data.column("src_ids").to_pylist() == expected
    assert f"token cache {entry} is unreadable" in caplog.text
    (aside,) = cache.glob(f"{entry.name}.corrupt-*")
    assert str(aside) in caplog.text
    assert json.loads((entry / "manifest.json").read_text())["sha256"]  # the rebuilt cache is whole
    caplog.clear()
    encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=cache)
    assert "unreadable" not in caplog.text  # and is reused from now on


@pytest.fixture(scope="module")
def texts(multi30k_dir: Path) -> tuple[list[str], list[str]]:
    return tuple(read_gz_lines(multi30k_dir / f"train.{lang}.gz", 500) for lang in ("de", "en"))


@pytest.mark.parametrize(
    "damage",
    [lambda path: path.write_bytes(b""), truncate, flip_a_byte],
    ids=["empty", "truncated", "bit_flip"],
)
def test_a_damaged_tokenizer_cache_is_moved_aside_and_retrained(
    texts: tuple[list[str], list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture, damage
) -> None:
    def load() -> Tokenizer:
        src, tgt = texts
        config = SubwordConfig(vocab_size=200)
        return train_or_load(src_texts=src, tgt_texts=tgt, config=config, cache_dir=tmp_path, corpus_key="k")[
            0
        ]

    first = load()
    (model,) = tmp_path.glob("*.model")
    damage(model)
    with caplog.at_level(logging.WARNING, logger="app.data.subword_training"):
        again = load()
    assert again.to_bytes() == first.to_bytes()  # the same settings and texts: the same model
    assert f"cached tokenizer {model} is unreadable" in caplog.text
    assert len(list(tmp_path.glob(f"{model.name}.corrupt-*"))) == 1
    assert model.read_bytes() == first.to_bytes()
