"""One renderer for every report: a table, and a document of blocks, as Markdown and as HTML.

Reports build a :class:`Table` (and, for a whole page, a list of blocks) once; :func:`markdown` and
:func:`html` write the same content in either format, so the two can no longer drift apart. Cells are text
already formatted by the report that made them; HTML escapes them, Markdown writes them as they are (the
committed reports quote them into README.md and docs/ as written).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from html import escape


@dataclass(frozen=True)
class Table:
    """A header and rows of text cells (one per column)."""

    header: tuple[str, ...]
    rows: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for cells in self.rows:
            if len(cells) != len(self.header):
                raise ValueError(f"a row of {len(cells)} cells under {len(self.header)} columns: {cells}")


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 1


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: list[str]


@dataclass(frozen=True)
class Warnings:
    """Warnings the reader must not miss (one line each; none renders no lines)."""

    texts: list[str]


@dataclass(frozen=True)
class Images:
    """PNG figures by file name: Markdown links the files beside the report, HTML embeds the bytes."""

    pngs: dict[str, bytes]


@dataclass(frozen=True)
class MarkdownOnly:
    """A block for the Markdown file only: e.g. a short table made to be quoted into Markdown pages,
    where the HTML page shows the full one."""

    block: Block


Block = Table | Heading | Paragraph | Bullets | Warnings | Images | MarkdownOnly


def markdown_table(table: Table) -> str:
    """``| a | b |`` rows under a ``|---|---|`` rule (GitHub-flavoured Markdown)."""
    lines = ["| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table.rows]
    return "\n".join(lines)


def html_table(table: Table) -> str:
    """One line of HTML: a bordered table with a header row; cells escaped."""
    head = "".join(f"<th>{escape(name)}</th>" for name in table.header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in cells) + "</tr>" for cells in table.rows
    )
    return f"<table border='1'><tr>{head}</tr>{body}</table>"


def data_uri(png: bytes) -> str:
    """A PNG as an ``<img src=...>`` value, for self-contained HTML."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def markdown_lines(block: Block) -> list[str]:
    """The Markdown lines of one block."""
    match block:
        case Table():
            return [markdown_table(block)]
        case Heading(text, level):
            return [f"{'#' * level} {text}"]
        case Paragraph(text):
            return [text]
        case Bullets(items):
            return [f"- {item}" for item in items]
        case Warnings(texts):
            return [f"> warning: {text}" for text in texts]
        case Images(pngs):
            return [f"![{name}]({name})" for name in pngs]
        case MarkdownOnly(inner):
            return markdown_lines(inner)
    raise TypeError(f"no Markdown for {block!r}")


def html_lines(block: Block) -> list[str]:
    """The HTML lines of one block (text is written as given: it comes from the report, not a user)."""
    match block:
        case Table():
            return [html_table(block)]
        case Heading(text, level):
            return [f"<h{level}>{text}</h{level}>"]
        case Paragraph(text):
            return [f"<p>{text}</p>"]
        case Bullets(items):
            return ["<ul>", *[f"<li>{item}</li>" for item in items], "</ul>"]
        case Warnings(texts):
            return [f"<p><b>warning:</b> {text}</p>" for text in texts]
        case Images(pngs):
            return [f"<p><img alt='{name}' src='{data_uri(png)}'></p>" for name, png in pngs.items()]
        case MarkdownOnly():
            return []
    raise TypeError(f"no HTML for {block!r}")


def markdown(blocks: list[Block]) -> str:
    """A Markdown file: the blocks one blank line apart (an empty block still leaves its blank line)."""
    lines: list[str] = []
    for index, block in enumerate(blocks):
        lines += ([""] if index else []) + markdown_lines(block)
    return "\n".join(lines) + "\n"


def html(title: str, blocks: list[Block]) -> str:
    """A self-contained HTML page titled ``title``: the blocks one per line, figures embedded."""
    head = f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
    lines = [head, *[line for block in blocks for line in html_lines(block)], "</body></html>"]
    return "\n".join(lines) + "\n"
