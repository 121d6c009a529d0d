"""app.data.multi30k and scripts/prepare_data.py on the committed test corpus; the corpus itself."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.training import REPO_ROOT

from app.data.multi30k import (
    EXPECTED_LINES,
    FIXTURE_LINES,
    LANGS,
    DownloadError,
    Multi30kError,
    count_lines,
    prepare_multi30k,
    write_slice,
)

FIXTURE_DIR = REPO_ROOT / "tests" / "fixtures" / "multi30k"


def test_fixture_is_the_release_layout_with_aligned_splits() -> None:
    names = sorted(p.name for p in FIXTURE_DIR.iterdir())
    assert names == sorted(f"{split}.{lang}.gz" for split in FIXTURE_LINES for lang in LANGS)
    for split, lines in FIXTURE_LINES.items():
        counts = {
            lang: count_lines(gzip.decompress((FIXTURE_DIR / f"{split}.{lang}.gz").read_bytes()))
            for lang in LANGS
        }
        assert counts == dict.fromkeys(LANGS, lines), split
    assert sum(p.stat().st_size for p in FIXTURE_DIR.iterdir()) < 500 * 1024


def test_fixture_is_reproduced_byte_for_byte(tmp_path: Path) -> None:
    """Cutting the fixture from itself gives it back: the first lines, and gzip without a time stamp."""
    sizes = write_slice(FIXTURE_DIR, tmp_path / "again", FIXTURE_LINES)
    for name in sizes:
        assert (tmp_path / "again" / name).read_bytes() == (FIXTURE_DIR / name).read_bytes(), name

    small = write_slice(FIXTURE_DIR, tmp_path / "small", {"val": 5}, langs=("de", "en"))
    assert sorted(small) == ["val.de.gz", "val.en.gz"]
    with gzip.open(FIXTURE_DIR / "val.de.gz", "rt", encoding="utf-8") as handle:
        first = [next(handle) for _ in range(5)]
    with gzip.open(tmp_path / "small" / "val.de.gz", "rt", encoding="utf-8") as handle:
        assert handle.readlines() == first


def test_write_slice_refuses_more_lines_than_there_are(tmp_path: Path) -> None:
    with pytest.raises(Multi30kError, match=r"val\.de in .* has 300 lines, fewer than 301"):
        write_slice(FIXTURE_DIR, tmp_path, {"val": 301}, langs=("de",))
    with pytest.raises(Multi30kError, match=r"unknown Multi30k split\(s\) \['dev'\]"):
        write_slice(FIXTURE_DIR, tmp_path, {"dev": 1})
    with pytest.raises(Multi30kError, match="source directory does not exist"):
        write_slice(tmp_path / "missing", tmp_path, {"val": 1})


def test_prepare_from_local_source_is_idempotent(multi30k_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "multi30k"
    summaries = prepare_multi30k(out, source=multi30k_dir, langs=("de", "en"), expected_lines=FIXTURE_LINES)
    assert {s.split: s.lines for s in summaries} == FIXTURE_LINES
    assert all(s.written == 2 and s.skipped == 0 for s in summaries)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{split}.{lang}" for split in FIXTURE_LINES for lang in ("de", "en")
    )
    with gzip.open(multi30k_dir / "val.de.gz", "rb") as handle:
        assert (out / "val.de").read_bytes() == handle.read()

    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = prepare_multi30k(out, source=multi30k_dir, langs=("de", "en"), expected_lines=FIXTURE_LINES)
    assert all(s.written == 0 and s.skipped == 2 for s in again)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes

    (out / "val.en").write_text("corrupted\n", encoding="utf-8")  # wrong content is repaired
    repaired = prepare_multi30k(out, source=multi30k_dir, langs=("de", "en"), expected_lines=None)
    assert {s.split: s.written for s in repaired} == {"train": 0, "val": 1, "test_2016_flickr": 0}
    assert len((out / "val.en").read_text(encoding="utf-8").splitlines()) == FIXTURE_LINES["val"]


def test_official_line_counts_refuse_a_truncated_corpus(multi30k_dir: Path, tmp_path: Path) -> None:
    """By default only the official counts pass: the fixture is a truncated corpus to this check."""
    expected = f"split 'train' has {FIXTURE_LINES['train']} lines, expected {EXPECTED_LINES['train']}"
    with pytest.raises(Multi30kError, match=expected):
        prepare_multi30k(tmp_path / "out", source=multi30k_dir, langs=("de", "en"))


def test_download_path_with_file_url(multi30k_dir: Path, tmp_path: Path) -> None:
    template = multi30k_dir.as_uri() + "/{split}.{lang}.gz"
    summaries = prepare_multi30k(
        tmp_path, langs=("fr",), splits=("val",), url_template=template, expected_lines=FIXTURE_LINES
    )
    assert [(s.split, s.lines, s.written) for s in summaries] == [("val", FIXTURE_LINES["val"], 1)]


def test_download_failure_is_clear(tmp_path: Path) -> None:
    template = (tmp_path / "nowhere").as_uri() + "/{split}.{lang}.gz"
    with pytest.raises(DownloadError, match=r"could not download .*val\.en\.gz.*--source"):
        prepare_multi30k(tmp_path / "out", langs=("en",), splits=("val",), url_template=template)


def test_mismatched_line_counts_and_bad_names(multi30k_dir: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "val.de").write_text("a\nb\n", encoding="utf-8")
    (fake / "val.en").write_text("a\n", encoding="utf-8")
    with pytest.raises(Multi30kError, match=r"differ in line count: \{'de': 2, 'en': 1\}"):
        prepare_multi30k(tmp_path / "out", source=fake, langs=("de", "en"), splits=("val",))
    with pytest.raises(Multi30kError, match=r"unknown Multi30k language\(s\) \['xx'\]"):
        prepare_multi30k(tmp_path / "out", source=multi30k_dir, langs=("de", "xx"))
    with pytest.raises(Multi30kError, match="source directory does not exist"):
        prepare_multi30k(tmp_path / "out", source=tmp_path / "missing")


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    """``python scripts/prepare_data.py ARGS`` as a user runs it."""
    command = [sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)


def test_script_prints_a_summary_and_fails_with_a_message(multi30k_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m30k"
    result = run_script("--source", str(multi30k_dir), "--out", str(out), "--langs", "cs", "en", "--any-size")
    assert result.returncode == 0, result.stderr
    assert f"train             {FIXTURE_LINES['train']}" in result.stdout
    assert f"test_2016_flickr  {FIXTURE_LINES['test_2016_flickr']}" in result.stdout
    assert (out / "train.cs").is_file()

    truncated = run_script("--source", str(multi30k_dir), "--out", str(tmp_path / "strict"), "--langs", "de")
    assert truncated.returncode == 1
    assert f"expected {EXPECTED_LINES['train']}" in truncated.stderr
    missing = run_script("--source", str(tmp_path / "missing"), "--out", str(out))
    assert missing.returncode == 1 and "source directory does not exist" in missing.stderr
