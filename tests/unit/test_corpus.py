"""Tests for app.data.corpus: faithful line reading via datasets, parallel checks, hub loader, filtering."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from app.data.corpus import (
    CorpusError,
    ParallelText,
    filter_pairs,
    load_hub_parallel,
    read_lines,
    read_parallel,
)


def plain_read(path: Path) -> list[str]:
    """Reference reader: Python text-mode iteration, only the line terminator removed."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "hf-cache"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("one\n\ntwo  \n\n", ["one", "", "two  ", ""]),  # empty lines (also last) and trailing spaces kept
        ("\n\n\n", ["", "", ""]),
        ("one\ntwo", ["one", "two"]),  # no trailing newline
        ("  a\r\nb\r\n\r\nc", ["  a", "b", "", "c"]),  # CRLF stripped, leading spaces kept
        ("tab\tin\x0cline\u2028x\n", ["tab\tin\x0cline\u2028x"]),  # only \n / \r end a line
        ("x\ry\n", ["x", "y"]),  # a lone CR ends a line (universal newlines), as in Python's open()
        ("", []),
    ],
)
def test_read_lines_matches_plain_read(
    tmp_path: Path, cache_dir: Path, text: str, expected: list[str]
) -> None:
    path = write(tmp_path / "corpus.txt", text)
    lines = read_lines(path, cache_dir=cache_dir)
    assert lines == expected
    assert lines == plain_read(path)


def test_read_lines_gzip(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "corpus.de.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("Ein Hund.\n\nZwei Männer  \nEnde")
    assert read_lines(path, cache_dir=cache_dir) == ["Ein Hund.", "", "Zwei Männer  ", "Ende"]


def test_read_lines_sees_edited_file(tmp_path: Path, cache_dir: Path) -> None:
    path = write(tmp_path / "corpus.txt", "a\nb\n")
    assert read_lines(path, cache_dir=cache_dir) == ["a", "b"]
    write(path, "c\n\nd\ne\n")
    assert read_lines(path, cache_dir=cache_dir) == ["c", "", "d", "e"]


def test_read_lines_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="not found"):
        read_lines(tmp_path / "missing.txt")


def test_read_parallel(tmp_path: Path, cache_dir: Path) -> None:
    src = write(tmp_path / "a.de", "Hallo\n\nWelt\n")
    tgt = write(tmp_path / "a.en", "Hello\n\nWorld\n")
    pair = read_parallel(src, tgt, cache_dir=cache_dir)
    assert pair == ParallelText(src=["Hallo", "", "Welt"], tgt=["Hello", "", "World"])
    assert len(pair) == 3


def test_read_parallel_length_mismatch_names_files_and_counts(tmp_path: Path, cache_dir: Path) -> None:
    src = write(tmp_path / "a.de", "".join(f"{i}\n" for i in range(10)))
    tgt = write(tmp_path / "a.en", "".join(f"{i}\n" for i in range(9)))
    with pytest.raises(CorpusError) as info:
        read_parallel(src, tgt, cache_dir=cache_dir)
    message = str(info.value)
    assert "a.de has 10 lines" in message
    assert "a.en has 9 lines" in message


def test_load_hub_parallel_local_json_dotted_columns(tmp_path: Path, cache_dir: Path) -> None:
    rows = [{"translation": {"de": "Ein Hund.", "en": "A dog."}}, {"translation": {"de": "", "en": ""}}]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    pair = load_hub_parallel(
        "json",
        data_files=str(data),
        split="train",
        src_column="translation.de",
        tgt_column="translation.en",
        cache_dir=cache_dir,
    )
    assert pair == ParallelText(src=["Ein Hund.", ""], tgt=["A dog.", ""])


def test_load_hub_parallel_flat_columns_and_unknown_column(tmp_path: Path, cache_dir: Path) -> None:
    data = tmp_path / "flat.jsonl"
    data.write_text(json.dumps({"de": "Haus", "en": "house"}) + "\n", encoding="utf-8")
    pair = load_hub_parallel(
        "json", data_files=str(data), split="train", src_column="de", tgt_column="en", cache_dir=cache_dir
    )
    assert pair == ParallelText(src=["Haus"], tgt=["house"])
    with pytest.raises(CorpusError, match=r"no column 'fr'.*\['de', 'en'\]"):
        load_hub_parallel(
            "json", data_files=str(data), split="train", src_column="de", tgt_column="fr", cache_dir=cache_dir
        )


def test_filter_pairs() -> None:
    src = [[1, 2], [], [1, 2, 3, 4], [5], [6, 7, 8]]
    tgt = [[1], [2], [3], [], [1, 2, 3]]
    keep, dropped = filter_pairs(src, tgt, max_len=3)
    assert keep == [0, 4]  # 1: empty src, 2: src too long, 3: empty tgt
    assert dropped == 3
    assert filter_pairs(src, tgt, max_len=4) == ([0, 2, 4], 2)


def test_filter_pairs_rejects_bad_arguments() -> None:
    with pytest.raises(CorpusError, match="max_len must be >= 1, got 0"):
        filter_pairs([[1]], [[1]], max_len=0)
    with pytest.raises(CorpusError, match="2 source vs 1 target"):
        filter_pairs([[1], [2]], [[1]], max_len=5)
