"""app.reports.eole (scripts/compare_with_eole.py): the Lightning budget string and the comparison table."""

from __future__ import annotations

import pytest

from app.reports.eole import comparison_rows, eole_comparison_markdown, format_max_time


@pytest.mark.parametrize(
    ("seconds", "expected"), [(1500, "00:00:25:00"), (3725, "00:01:02:05"), (59, "00:00:00:59")]
)
def test_budget_in_lightning_max_time_format(seconds: int, expected: str) -> None:
    assert format_max_time(seconds) == expected


def test_table_has_both_toolkits_and_the_ratios() -> None:
    eole = {
        "params": 7585856,
        "final_checkpoint_step": 925,
        "src_plus_tgt_tok_per_s": 4000.0,
        "train_peak_rss_MiB": 3400.4,
        "beam5": {"BLEU": 33.4, "BLEU_lc": 33.9, "chrF": 52.9, "sent_per_s": 89.0},
    }
    ours = {
        "parameters": 7578624,
        "global_step": 1800,
        "train_tokens_per_s": 6000,
        "test_bleu": 35.0,
        "test_bleu_lc": 35.3,
        "test_chrf": 55.0,
        "test_decode_sentences_per_s": 86.1,
        "peak_rss_mb": 2325,
    }
    rows = comparison_rows(eole, ours)
    assert [row["toolkit"] for row in rows] == ["eole 0.6.4", "this project"]
    table = eole_comparison_markdown(rows, 1500)
    assert "25-minute training budget" in table
    assert "| eole 0.6.4 | 7,585,856 | 925 | 4,000 | 33.40 | 33.90 | 52.9 | 89.0 | 3,400 |" in table
    assert "| this project | 7,578,624 | 1,800 | 6,000 | 35.00 | 35.30 | 55.0 | 86.1 | 2,325 |" in table
    assert "1.50x" in table and "+1.60" in table
