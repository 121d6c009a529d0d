"""Caches that heal: a token cache or a cached sentencepiece model that fails to load, no longer
matches the checksum recorded for it, or lost or garbled its manifest, is moved aside and rebuilt, with
one warning naming it."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import datasets
import pytest
from helpers.training import read_gz_lines

from app.data.cache_manifest import write_manifest
from app.data.corpus import open_parallel
from app.data.encoded import FORMAT_VERSION, encode_split
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


def write_json(entry: Path, value: object) -> None:
    (entry / "manifest.json").write_text(json.dumps(value))


def edit_manifest(entry: Path, **changes: object) -> None:
    write_json(entry, {**json.loads((entry / "manifest.json").read_text()), **changes})


def widen_ids(entry: Path) -> None:
    """The same rows with int64 ids, described by a manifest that matches the new file byte for byte:
    only the columns' types tell that it is not what this code writes."""
    table = datasets.Dataset.from_file(str(entry / "ids.arrow"))
    wide = table.features.copy()
    for side in ("src_ids", "tgt_ids"):
        wide[side] = datasets.List(datasets.Value("int64"))
    table.cast(wide).to_parquet(entry / "wide.parquet")  # cast's table lives in memory: write it out
    rebuilt = datasets.Dataset.from_parquet(str(entry / "wide.parquet"), cache_dir=str(entry / "hf"))
    rebuilt.map(lambda batch: batch, batched=True, cache_file_name=str(entry / "ids.arrow.new"))
    (entry / "ids.arrow.new").replace(entry / "ids.arrow")
    write_manifest(entry, format_version=FORMAT_VERSION, rows=table.num_rows, files=["ids.arrow"])


def replace_with_a_file(entry: Path) -> None:
    for child in entry.iterdir():
        child.unlink()
    entry.rmdir()
    entry.write_text("not a directory")


# Each damages the entry of a token cache (its directory); all leave it where the next run looks.
ENTRY_DAMAGE = {
    "truncated": lambda entry: truncate(entry / "ids.arrow"),
    "bit_flip": lambda entry: flip_a_byte(entry / "ids.arrow"),
    "truncated_old_manifest": lambda entry: (drop_checksums(entry), truncate(entry / "ids.arrow")),
    "missing_file": lambda entry: (entry / "ids.arrow").unlink(),
    "no_manifest": lambda entry: (entry / "manifest.json").unlink(),  # was: Errno 39 on every run
    "manifest_null": lambda entry: write_json(entry, None),  # was: AttributeError on every run
    "manifest_list": lambda entry: write_json(entry, []),
    "manifest_empty": lambda entry: (entry / "manifest.json").write_text(""),
    "files_null": lambda entry: edit_manifest(entry, files=None),  # was: loaded as an empty split
    "file_outside": lambda entry: edit_manifest(entry, files=["../ids.arrow"], bytes={}, sha256={}),
    "rows_text": lambda entry: edit_manifest(entry, rows="200"),
    "other_format": lambda entry: edit_manifest(entry, format=FORMAT_VERSION + 1),
    "int64_ids": widen_ids,  # was: loaded, ids of another type than every batch expects
    "a_file": replace_with_a_file,  # was: NotADirectoryError on every run
}


@pytest.mark.parametrize("damage", ENTRY_DAMAGE.values(), ids=ENTRY_DAMAGE.keys())
def test_a_damaged_token_cache_is_moved_aside_and_rebuilt(
    corpus: datasets.Dataset,
    spm_tokenizer: Tokenizer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage,
) -> None:
    cache = tmp_path / "tokens"
    entry, expected = build(corpus, spm_tokenizer, cache)
    damage(entry)
    with caplog.at_level(logging.WARNING, logger="app.data.encoded"):
        again = encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=cache)
    assert again.data.column("src_ids").to_pylist() == expected
    assert again.features["src_ids"].feature.dtype == "int32"
    (warning,) = caplog.records  # logged once
    assert f"token cache {entry} is unreadable" in warning.getMessage()
    (aside,) = cache.glob(f"{entry.name}.corrupt-*")
    assert str(aside) in warning.getMessage()
    assert json.loads((entry / "manifest.json").read_text())["sha256"]  # the rebuilt cache is whole
    caplog.clear()
    encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=cache)
    assert "unreadable" not in caplog.text  # and is reused from now on


@pytest.fixture(scope="module")
def texts(multi30k_dir: Path) -> tuple[list[str], list[str]]:
    return tuple(read_gz_lines(multi30k_dir / f"train.{lang}.gz", 500) for lang in ("de", "en"))


def load_tokenizer(texts: tuple[list[str], list[str]], cache_dir: Path) -> Tokenizer:
    src, tgt = texts
    config = SubwordConfig(vocab_size=200)
    return train_or_load(src_texts=src, tgt_texts=tgt, config=config, cache_dir=cache_dir, corpus_key="k")[0]


@pytest.fixture(scope="module")
def tokenizer_cache(texts: tuple[list[str], list[str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the model (and its checksum), trained once for every test to copy and damage."""
    cache = tmp_path_factory.mktemp("spm")
    load_tokenizer(texts, cache)
    return cache


def replace_with_a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def garble_checksum(path: Path) -> None:
    path.with_name(path.name + ".sha256").write_bytes(b"\xff\xfe")


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(b""),
        truncate,
        flip_a_byte,
        replace_with_a_directory,  # was: IsADirectoryError on every run
        garble_checksum,  # was: UnicodeDecodeError on every run
    ],
    ids=["empty", "truncated", "bit_flip", "a_directory", "checksum_not_text"],
)
def test_a_damaged_tokenizer_cache_is_moved_aside_and_retrained(
    texts: tuple[list[str], list[str]],
    tokenizer_cache: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damage,
) -> None:
    for file in tokenizer_cache.iterdir():
        shutil.copy(file, tmp_path / file.name)
    (model,) = tmp_path.glob("*.model")
    first = model.read_bytes()
    damage(model)
    with caplog.at_level(logging.WARNING, logger="app.data.subword_training"):
        again = load_tokenizer(texts, tmp_path)
    assert again.to_bytes() == first  # the same settings and texts: the same model
    (warning,) = caplog.records  # logged once
    assert f"cached tokenizer {model} is unreadable" in warning.getMessage()
    assert len(list(tmp_path.glob(f"{model.name}.corrupt-*"))) == 1
    assert model.read_bytes() == first
