"""A ``datasets`` Arrow cache cut short or overwritten is rebuilt, never read short (app.data.hf_cache)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from app.data.corpus import load_hub_parallel, read_lines

LINES = [f"line {number}" for number in range(1, 5001)]


def arrow_file(cache_dir: Path) -> Path:
    (found,) = cache_dir.rglob("*.arrow")
    return found


def keep_batches(path: Path, rows: int) -> None:
    """Rewrite the cache as a valid Arrow stream of its first ``rows`` rows: it maps without error."""
    table = pa.ipc.open_stream(pa.OSFile(str(path)).read_buffer()).read_all()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.slice(0, rows), max_chunksize=100)


def truncate(path: Path) -> None:
    """Cut the file mid-record: mapping it fails."""
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def overwrite(path: Path) -> None:
    path.write_bytes(b"not arrow")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "rows missing": lambda path: keep_batches(path, 300),
    "rows all gone": lambda path: keep_batches(path, 0),
    "cut mid-record": truncate,
    "overwritten": overwrite,
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_text_cache_is_rebuilt(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "corpus.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    cache_dir = tmp_path / "hf-cache"
    assert read_lines(source, cache_dir=cache_dir) == LINES
    DAMAGE[damage](arrow_file(cache_dir))
    with caplog.at_level(logging.WARNING, logger="app.data.hf_cache"):
        assert read_lines(source, cache_dir=cache_dir) == LINES
    assert "rebuilding it" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.data.hf_cache"):
        assert read_lines(source, cache_dir=cache_dir) == LINES  # the rebuilt cache loads as it is
    assert "rebuilding" not in caplog.text


def test_a_short_hub_split_cache_is_rebuilt(tmp_path: Path) -> None:
    data = tmp_path / "pairs.jsonl"
    rows = [{"de": f"Haus {number}", "en": f"house {number}"} for number in range(2000)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    cache_dir = tmp_path / "hf-cache"

    def load() -> list[str]:
        return load_hub_parallel(
            "json", data_files=str(data), split="train", src_column="de", tgt_column="en", cache_dir=cache_dir
        ).tgt

    assert load() == [row["en"] for row in rows]
    keep_batches(arrow_file(cache_dir), 500)
    assert load() == [row["en"] for row in rows]


def test_a_missing_source_is_not_taken_for_a_cache_fault(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_hub_parallel(
            "json",
            data_files=str(tmp_path / "absent.jsonl"),
            split="train",
            src_column="de",
            tgt_column="en",
            cache_dir=tmp_path / "hf-cache",
        )
