"""Tests for app.data.multi30k and scripts/prepare_data.py, using the local copy of Multi30k."""

from __future__ import annotations

import gzip
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

from app.data.multi30k import DownloadError, Multi30kError, prepare_multi30k

REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K_DIR = (REPO_ROOT / os.environ.get("MULTI30K_DIR", "../shared/data/multi30k")).resolve()
EXPECTED = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}


@pytest.fixture
def source() -> Path:
    if not (MULTI30K_DIR / "val.en.gz").is_file():
        pytest.skip(f"Multi30k not found at {MULTI30K_DIR} (set MULTI30K_DIR)")
    return MULTI30K_DIR


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prepare_data", REPO_ROOT / "scripts" / "prepare_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepare_from_local_source_is_idempotent(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "multi30k"
    summaries = prepare_multi30k(out, source=source, langs=("de", "en"))
    assert {s.split: s.lines for s in summaries} == EXPECTED
    assert all(s.written == 2 and s.skipped == 0 for s in summaries)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{split}.{lang}" for split in EXPECTED for lang in ("de", "en")
    )
    with gzip.open(source / "val.de.gz", "rb") as handle:
        assert (out / "val.de").read_bytes() == handle.read()

    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = prepare_multi30k(out, source=source, langs=("de", "en"))
    assert all(s.written == 0 and s.skipped == 2 for s in again)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes

    (out / "val.en").write_text("corrupted\n", encoding="utf-8")  # wrong content is repaired
    repaired = {s.split: s.written for s in prepare_multi30k(out, source=source, langs=("de", "en"))}
    assert repaired == {"train": 0, "val": 1, "test_2016_flickr": 0}
    assert len((out / "val.en").read_text(encoding="utf-8").splitlines()) == 1_014


def test_download_path_with_file_url(source: Path, tmp_path: Path) -> None:
    template = source.as_uri() + "/{split}.{lang}.gz"
    summaries = prepare_multi30k(tmp_path, langs=("fr",), splits=("val",), url_template=template)
    assert [(s.split, s.lines, s.written) for s in summaries] == [("val", 1_014, 1)]


def test_download_failure_is_clear(tmp_path: Path) -> None:
    template = (tmp_path / "nowhere").as_uri() + "/{split}.{lang}.gz"
    with pytest.raises(DownloadError, match=r"could not download .*val\.en\.gz.*--source"):
        prepare_multi30k(tmp_path / "out", langs=("en",), splits=("val",), url_template=template)


def test_mismatched_line_counts_and_bad_names(source: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "val.de").write_text("a\nb\n", encoding="utf-8")
    (fake / "val.en").write_text("a\n", encoding="utf-8")
    with pytest.raises(Multi30kError, match=r"differ in line count: \{'de': 2, 'en': 1\}"):
        prepare_multi30k(tmp_path / "out", source=fake, langs=("de", "en"), splits=("val",))
    with pytest.raises(Multi30kError, match=r"unknown Multi30k language\(s\) \['xx'\]"):
        prepare_multi30k(tmp_path / "out", source=source, langs=("de", "xx"))
    with pytest.raises(Multi30kError, match="source directory does not exist"):
        prepare_multi30k(tmp_path / "out", source=tmp_path / "missing")


def test_script_main(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script()
    out = tmp_path / "m30k"
    assert script.main(["--source", str(source), "--out", str(out), "--langs", "cs", "en"]) == 0
    printed = capsys.readouterr().out
    assert "train             29000" in printed
    assert "test_2016_flickr  1000" in printed
    assert (out / "train.cs").is_file()
    assert script.main(["--source", str(tmp_path / "missing"), "--out", str(out)]) == 1
    assert "source directory does not exist" in capsys.readouterr().err
