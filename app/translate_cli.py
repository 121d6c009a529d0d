"""The ``translate.py`` command line: sentences from arguments, standard input or a file.

Guarantees: exactly one output line per input line, in order; an empty line gives an empty line;
invalid UTF-8 is replaced (with a warning on stderr) and a line longer than the model accepts is
truncated (with a warning), never dropped. Lines are split on ``\\n`` only (a trailing ``\\r`` is
removed), so other Unicode line separators inside a sentence never shift the alignment.
``--plot-attention DIR`` also writes one attention heatmap per non-empty line (``DIR/line_000001.png``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

import torch

from app.checkpoint import CheckpointError, load_translator
from app.translator import SearchSettings, Translator


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Translate sentences with a trained checkpoint.")
    parser.add_argument("checkpoint", help="a .ckpt written by train.py (self-contained)")
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: read input lines)")
    parser.add_argument("-i", "--input", help="read lines from this file instead of standard input")
    parser.add_argument("-o", "--output", help="write translations to this file instead of standard output")
    parser.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy search (default 5)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences decoded together (default 64)")
    parser.add_argument("--max-len", type=int, default=256, help="most output subwords per sentence")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="GNMT length penalty alpha")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--plot-attention",
        metavar="DIR",
        help="also write one attention heatmap PNG per non-empty input line to DIR (line_000001.png, ...)",
    )
    parser.add_argument(
        "--attention-layer",
        type=int,
        help="Transformer decoder layer whose cross-attention is plotted (default: the last)",
    )
    parser.add_argument(
        "--attention-head", type=int, help="plot this attention head only (default: the mean over heads)"
    )
    # Intermixed: sentences may follow options (`CKPT --beam 1 "..."`), which plain parse_args rejects.
    return parser.parse_intermixed_args(argv)


def decode_lines(raw: BinaryIO, warn: TextIO) -> Iterator[str]:
    """Lines of a byte stream as text, split on b'\\n' only; bad UTF-8 is replaced with a warning."""
    for number, line in enumerate(raw, start=1):
        line = line.removesuffix(b"\n").removesuffix(b"\r")
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            print(f"warning: line {number}: invalid UTF-8 replaced with U+FFFD", file=warn)
            yield line.decode("utf-8", errors="replace")


def chunks(lines: Iterable[str], size: int, flush_each: bool) -> Iterator[list[str]]:
    """Groups of ``size`` lines; single lines when interactive so each answer comes at once."""
    group: list[str] = []
    for line in lines:
        group.append(line)
        if flush_each or len(group) == size:
            yield group
            group = []
    if group:
        yield group


@dataclass(frozen=True)
class PlotSettings:
    """Where and what ``--plot-attention`` draws."""

    directory: Path
    layer: int | None = None
    head: int | None = None


def translate_group(
    translator: Translator,
    group: list[str],
    settings: SearchSettings,
    *,
    first_line: int,
    on_truncate: Callable[[int, int], None],
    plots: PlotSettings | None,
) -> list[str]:
    """Translations of ``group``; with ``plots``, also one heatmap per non-empty line."""
    if plots is None:
        return translator.translate(group, settings, on_truncate=on_truncate)
    from app.attention_plot import plot_file_name, save_attention_plot  # matplotlib: only when plotting

    maps = translator.translate_with_attention(
        group, settings, layer=plots.layer, head=plots.head, on_truncate=on_truncate
    )
    for index, attention in enumerate(maps):
        if attention is not None:
            line = first_line + index
            title = f"line {line}: {attention.translation}"
            save_attention_plot(attention, plots.directory / plot_file_name(line), title=title)
    return ["" if m is None else m.translation for m in maps]


def translate_stream(
    translator: Translator,
    lines: Iterable[str],
    out: TextIO,
    settings: SearchSettings,
    *,
    interactive: bool = False,
    plots: PlotSettings | None = None,
) -> int:
    """Translate ``lines`` to ``out``, one line each; returns how many lines were written."""
    written = 0
    for group in chunks(lines, settings.batch_size * 8, flush_each=interactive):
        offset = written

        def warn_truncated(index: int, length: int, offset: int = offset) -> None:
            print(
                f"warning: line {offset + index + 1}: {length} subwords exceed the model's limit of "
                f"{translator.max_source_tokens}; truncated",
                file=sys.stderr,
            )

        texts = translate_group(
            translator, group, settings, first_line=offset + 1, on_truncate=warn_truncated, plots=plots
        )
        for text in texts:
            out.write(text.replace("\n", " ") + "\n")
            written += 1
        out.flush()
    return written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = SearchSettings(
            beam=args.beam, alpha=args.length_penalty, max_len=args.max_len, batch_size=args.batch_size
        )
        translator, _ = load_translator(args.checkpoint, device=args.device)
    except (CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        lines = input_lines(args, stack)
        if args.output:
            out: TextIO = stack.enter_context(open(args.output, "w", encoding="utf-8"))
        else:
            sys.stdout.reconfigure(encoding="utf-8")  # translations may hold any character
            out = sys.stdout
        interactive = not args.sentences and not args.input and sys.stdin.isatty()
        plots = (
            PlotSettings(Path(args.plot_attention), layer=args.attention_layer, head=args.attention_head)
            if args.plot_attention
            else None
        )
        try:
            translate_stream(translator, lines, out, settings, interactive=interactive, plots=plots)
        except ValueError as err:  # e.g. an attention layer or head the model lacks
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 0


def input_lines(args: argparse.Namespace, stack: ExitStack) -> Iterable[str]:
    """The sentences given as arguments, else the lines of ``-i FILE``, else standard input."""
    if args.sentences:
        return [s.replace("\n", " ") for s in args.sentences]
    if args.input:
        try:
            return decode_lines(stack.enter_context(open(args.input, "rb")), sys.stderr)
        except OSError as err:
            raise SystemExit(f"error: cannot read {args.input}: {err.strerror}") from err
    return decode_lines(sys.stdin.buffer, sys.stderr)
