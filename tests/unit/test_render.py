"""app.reports.render: one table model and one document, written as Markdown and as HTML."""

from __future__ import annotations

import pytest

from app.reports.render import (
    Bullets,
    Heading,
    Images,
    MarkdownOnly,
    Paragraph,
    Table,
    Warnings,
    data_uri,
    html,
    html_table,
    markdown,
    markdown_table,
)

TABLE = Table(("variant", "BLEU"), [["eager", "41.50"], ["a <b> & 'c'", "-"]])


def test_a_table_as_markdown() -> None:
    assert markdown_table(TABLE) == ("| variant | BLEU |\n|---|---|\n| eager | 41.50 |\n| a <b> & 'c' | - |")


def test_the_same_table_as_html_escapes_its_cells() -> None:
    assert html_table(TABLE) == (
        "<table border='1'><tr><th>variant</th><th>BLEU</th></tr>"
        "<tr><td>eager</td><td>41.50</td></tr>"
        "<tr><td>a &lt;b&gt; &amp; &#x27;c&#x27;</td><td>-</td></tr></table>"
    )


def test_a_row_of_the_wrong_width_names_its_cells() -> None:
    with pytest.raises(ValueError, match=r"a row of 1 cells under 2 columns: \['eager'\]"):
        Table(("variant", "BLEU"), [["eager"]])


def test_one_document_in_both_formats() -> None:
    """Blocks one blank line apart in Markdown (an empty block keeps its line), one per line in HTML;
    a Markdown-only block is left out of the HTML page; figures are linked, or embedded."""
    png = b"\x89PNG"
    blocks = [
        Heading("Report"),
        Warnings([]),
        Heading("Group 1", level=2),
        Bullets(["data: x", "budget: y"]),
        MarkdownOnly(Paragraph("All columns:")),
        TABLE,
        Images({"a.png": png}),
    ]
    assert markdown(blocks) == (
        "# Report\n\n\n## Group 1\n\n- data: x\n- budget: y\n\nAll columns:\n\n"
        f"{markdown_table(TABLE)}\n\n![a.png](a.png)\n"
    )
    assert html("Report", blocks).splitlines() == [
        "<!doctype html><html><head><meta charset='utf-8'><title>Report</title></head><body>",
        "<h1>Report</h1>",
        "<h2>Group 1</h2>",
        "<ul>",
        "<li>data: x</li>",
        "<li>budget: y</li>",
        "</ul>",
        html_table(TABLE),
        f"<p><img alt='a.png' src='{data_uri(png)}'></p>",
        "</body></html>",
    ]


def test_warnings_in_both_formats() -> None:
    blocks = [Warnings(["groups differ"])]
    assert markdown(blocks) == "> warning: groups differ\n"
    assert "<p><b>warning:</b> groups differ</p>" in html("t", blocks).splitlines()
