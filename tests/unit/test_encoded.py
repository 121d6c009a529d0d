"""Tests for the Arrow data pipeline: token cache, batch fetching, filters, bad input, synthetic corpora."""

from __future__ import annotations

import gzip
from pathlib import Path

import datasets
import numpy as np
import pytest
from torch.utils.data import DataLoader

from app.data.batch import Collator
from app.data.corpus import CorpusError, keep_mask, open_parallel
from app.data.encoded import EncodedPairs, encode_split, text_column
from app.data.subword_training import _training_sentences, train_or_load
from app.data.synthetic import synthetic_pairs, write_synthetic_corpus
from app.data.tokenizer import SubwordConfig, Tokenizer

SRC = ["Ein Hund läuft.", "", "Zwei Männer spielen Fußball im Park.", "Eine Frau.", "Kinder"]
TGT = ["A dog runs.", "", "Two men play football in the park.", "A woman.", "Children playing outside now"]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> datasets.Dataset:
    src = write_lines(tmp_path / "c.de", SRC)
    tgt = write_lines(tmp_path / "c.en", TGT)
    return open_parallel(src, tgt, cache_dir=tmp_path / "hf")


def test_encoded_split_matches_the_tokenizer_and_is_cached(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    cache = tmp_path / "tokens"
    encoded = encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=cache)
    assert encoded.column_names == ["src_ids", "tgt_ids", "src_len", "tgt_len"]
    pairs = EncodedPairs(encoded)
    expected_src, expected_tgt = spm_tokenizer.encode(SRC), spm_tokenizer.encode(TGT)
    batch = pairs.__getitems__([4, 0, 2])
    assert [i for i, _, _ in batch] == [4, 0, 2]
    assert [s.tolist() for _, s, _ in batch] == [expected_src[i] for i in (4, 0, 2)]
    assert [t.tolist() for _, _, t in batch] == [expected_tgt[i] for i in (4, 0, 2)]
    assert pairs.lengths().tolist() == [
        max(len(s), len(t)) + 1 for s, t in zip(expected_src, expected_tgt, strict=True)
    ]
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    stamp = (entry / "manifest.json").stat().st_mtime_ns
    again = encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=cache, num_proc=2)
    assert (entry / "manifest.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert again.data.column("src_ids").to_pylist() == expected_src
    assert sorted(p.name for p in cache.iterdir()) == [entry.name]  # no temporary directories left


def test_num_proc_gives_the_same_columns(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    one = encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=tmp_path / "a")
    two = encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=tmp_path / "b", num_proc=2)
    assert two.data.to_pydict() == one.data.to_pydict()
    assert len(list((tmp_path / "b").glob("*/*.arrow"))) == 2  # one shard per tokenizing process


def test_another_tokenizer_or_corpus_never_reuses_a_cache(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    cache = tmp_path / "tokens"
    encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=cache)
    other_tok, _ = train_or_load(
        src_texts=SRC * 20,
        tgt_texts=TGT * 20,
        config=SubwordConfig(vocab_size=60),
        cache_dir=tmp_path,
        corpus_key="x",
    )
    by_other_tokenizer = encode_split(corpus, other_tok, other_tok, cache_dir=cache)
    assert by_other_tokenizer.data.column("src_ids").to_pylist() == other_tok.encode(SRC)
    edited = open_parallel(
        write_lines(tmp_path / "d.de", [*SRC[:-1], "Katzen"]), tmp_path / "c.en", cache_dir=tmp_path / "hf"
    )
    by_other_corpus = encode_split(edited, spm_tokenizer, spm_tokenizer, cache_dir=cache)
    assert by_other_corpus.data.column("src_ids").to_pylist()[-1] == spm_tokenizer.encode(["Katzen"])[0]
    assert len([p for p in cache.iterdir()]) == 3


def test_filter_and_truncation_on_length_columns(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    encoded = encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=tmp_path)
    src_len, tgt_len = EncodedPairs(encoded).side_lengths()
    keep, counts = keep_mask(src_len, tgt_len, max_len=100)
    assert keep.tolist() == [True, False, True, True, True] and counts.dropped == 1  # the empty pair
    _, by_ratio = keep_mask(src_len, tgt_len, max_len=100, max_ratio=1.0 + 1e-9)
    unequal = sum(1 for s, t in zip(src_len, tgt_len, strict=True) if s and t and s != t)
    assert (by_ratio.empty_or_long, by_ratio.ratio) == (1, unequal)
    kept = EncodedPairs(encoded, rows=np.flatnonzero(keep))
    assert len(kept) == 4 and kept[1][1].tolist() == spm_tokenizer.encode([SRC[2]])[0]
    short = EncodedPairs(encoded, truncate=2)
    assert all(len(s) <= 2 and len(t) <= 2 for _, s, t in short.__getitems__(range(5)))
    with pytest.raises(CorpusError, match=r"max_ratio must be >= 1 or null, got 0\.5"):
        keep_mask(src_len, tgt_len, max_len=10, max_ratio=0.5)


def test_batches_from_a_table_of_many_chunks_match_row_by_row(tmp_path: Path) -> None:
    """A large cache is a table of many chunks (one per 1,000 rows); rows are found across them."""
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 50, size=rng.integers(0, 7)).tolist() for _ in range(40)]
    parts = [
        datasets.Dataset.from_dict(
            {"src_ids": rows[i : i + 6], "tgt_ids": [r[::-1] for r in rows[i : i + 6]]},
            features=datasets.Features(
                {name: datasets.List(datasets.Value("int32")) for name in ("src_ids", "tgt_ids")}
            ),
        )
        for i in range(0, 40, 6)
    ]
    table = datasets.concatenate_datasets(parts).select(range(3, 40))  # a sliced chunk at the start
    assert table.data.column("src_ids").num_chunks > 5
    pairs = EncodedPairs(table)
    picks = [36, 0, 5, 6, 17, 17, 29, -1]
    for position, src, tgt in pairs.__getitems__(picks):
        expected = rows[3 + position]
        assert (src.tolist(), tgt.tolist()) == (expected, expected[::-1])
    kept = EncodedPairs(table, rows=np.array([30, 2, 11]))
    assert [s.tolist() for _, s, _ in kept.__getitems__([2, 0, 1])] == [rows[14], rows[33], rows[5]]


def test_collator_pads_numpy_examples_like_lists() -> None:
    collate = Collator(pad_id=0, bos_id=2, eos_id=3)
    as_lists = collate([(0, [5, 6], [7]), (1, [8], [9, 10, 11])])
    as_arrays = collate(
        [(0, np.array([5, 6], np.int32), np.array([7])), (1, np.array([8]), np.array([9, 10, 11]))]
    )
    assert as_lists.src.tolist() == as_arrays.src.tolist() == [[5, 6, 3], [8, 3, 0]]
    assert as_lists.tgt_in.tolist() == as_arrays.tgt_in.tolist() == [[2, 7, 0, 0], [2, 9, 10, 11]]
    assert as_lists.tgt_out.tolist() == as_arrays.tgt_out.tolist() == [[7, 3, 0, 0], [9, 10, 11, 3]]


# -- bad input ---------------------------------------------------------------------------------------------


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.de.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b"gut\nauch gut\nkaputt \xff\xfe hier\nende\n")
    good = write_lines(tmp_path / "good.en", ["a", "b", "c", "d"])
    with pytest.raises(CorpusError, match=r"bad\.de\.gz: line 3 .*is not valid UTF-8"):
        open_parallel(path, good, cache_dir=tmp_path / "hf")


def test_misaligned_sides_name_both_files_and_counts(tmp_path: Path) -> None:
    src = write_lines(tmp_path / "m.de", ["x"] * 7)
    tgt = write_lines(tmp_path / "m.en", ["y"] * 5)
    with pytest.raises(CorpusError, match=r"m\.de has 7 lines, .*m\.en has 5 lines"):
        open_parallel(src, tgt, cache_dir=tmp_path / "hf")


# -- sentencepiece sampling and synthetic corpora ----------------------------------------------------------


def test_training_sample_is_bounded_reproducible_and_streams_arrow_columns(corpus: datasets.Dataset) -> None:
    src, tgt = text_column(corpus, "src"), text_column(corpus, "tgt")
    everything = list(_training_sentences([src, tgt], limit=100, seed=0))
    assert everything == [t for t in SRC + TGT if t.strip()]  # small corpus: all, in order
    sample = list(_training_sentences([src, tgt], limit=4, seed=3))
    assert len(sample) <= 4 and set(sample) <= set(everything)
    assert sample == list(_training_sentences([SRC, TGT], limit=4, seed=3))  # lists and columns alike
    draws = {tuple(_training_sentences([src, tgt], limit=4, seed=s)) for s in range(6)}
    assert len(draws) > 1  # the seed matters


def test_synthetic_corpus_is_deterministic_and_perturbed(tmp_path: Path) -> None:
    pairs = list(synthetic_pairs(SRC, TGT, 23, seed=1))
    assert pairs == list(synthetic_pairs(SRC, TGT, 23, seed=1))
    assert pairs[:5] == list(zip(SRC, TGT, strict=True))  # the first copy is the base corpus
    assert pairs[5:] != list(synthetic_pairs(SRC, TGT, 23, seed=2))[5:]
    assert any(p != pairs[i % 5] for i, p in enumerate(pairs[5:], start=5))
    written = write_synthetic_corpus(
        write_lines(tmp_path / "b.de", SRC), write_lines(tmp_path / "b.en", TGT), tmp_path / "s", 23, seed=1
    )
    assert written.src.read_text(encoding="utf-8").splitlines() == [s for s, _ in pairs]


def test_worker_processes_assemble_the_same_batches(
    corpus: datasets.Dataset, spm_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    pairs = EncodedPairs(encode_split(corpus, spm_tokenizer, spm_tokenizer, cache_dir=tmp_path), truncate=3)
    collate = Collator(pad_id=0, bos_id=2, eos_id=3)
    order = [[4, 0], [2], [1, 3]]
    loaders = [DataLoader(pairs, batch_sampler=order, collate_fn=collate, num_workers=n) for n in (0, 1)]
    in_process, in_worker = (
        [(b.index.tolist(), b.src.tolist(), b.tgt_in.tolist()) for b in ld] for ld in loaders
    )
    assert in_process == in_worker
    assert [index for index, _, _ in in_process] == order
