"""The ``translate.py`` command line: sentences from arguments, standard input or a file.

Guarantees: exactly one output line per input line, in order; an empty line gives an empty line;
invalid UTF-8 is replaced (with a warning on stderr) and a line longer than the model accepts is
truncated (with a warning), never dropped. Lines are split on ``\\n`` only (a trailing ``\\r`` is
removed), so other Unicode line separators inside a sentence never shift the alignment.
``--plot-attention DIR`` also writes one attention heatmap per non-empty line (``DIR/line_000001.png``).
``--ref FILE`` also scores the translations against FILE (one reference per input line) with
:func:`app.inference.evaluate.evaluate`: BLEU, lowercased BLEU, chrF, speed and the sacreBLEU signature
go to standard error, so standard output stays the translations.
``MODEL`` is a checkpoint (torch engine) or a directory from ``scripts/export.py --format ct2`` (CTranslate2);
``--ensemble CKPT`` (repeatable) decodes MODEL and CKPT together, their per-token distributions averaged;
``--format jsonl`` writes one JSON object per input line instead of text (see :func:`jsonl_record`).
In a pipe it behaves like other Unix filters: ``--buffer-size 1`` answers each line as soon as it is read
(a program that writes one line and waits gets its answer), and a reader that stops early
(``translate.py ... | head -1``) ends the run quietly with status 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch

from app.acceleration.auto import COMPILE_MODES
from app.checkpoint import CheckpointError
from app.decoding import Sampling
from app.decoding.beam import LENGTH_NORMS
from app.inference.engine import Engine, SearchSettings
from app.inference.engines import ENGINES, open_engine
from app.inference.evaluate import Evaluation, evaluate
from app.inference.lines import (
    OutputError,
    chunks,
    decode_lines,
    jsonl_record,
    output_file,
    silence_stdout,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Translate sentences with a trained checkpoint.")
    parser.add_argument(
        "checkpoint",
        metavar="MODEL",
        help="a .ckpt written by train.py, or a directory written by scripts/export.py --format ct2",
    )
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: read input lines)")
    parser.add_argument("-i", "--input", help="read lines from this file instead of standard input")
    parser.add_argument("-o", "--output", help="write translations to this file instead of standard output")
    parser.add_argument("--beam", type=int, default=5, help="beam size; 1 = greedy search (default 5)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences decoded together (default 64)")
    parser.add_argument(
        "--buffer-size",
        type=int,
        metavar="N",
        help="read N input lines before translating them and writing their answers; 1 answers each "
        "line as soon as it arrives (default: 1 on a terminal, else 8 x --batch-size)",
    )
    parser.add_argument("--max-len", type=int, default=256, help="most output subwords per sentence")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="GNMT length penalty alpha")
    parser.add_argument(
        "--length-norm",
        choices=LENGTH_NORMS,
        help="beam scores over ((5 + |Y|) / 6)^alpha (gnmt) or |Y|^alpha (power: Marian, Hugging Face) "
        "(default: the checkpoint's test_search.length_norm: power for imported Marian models, else gnmt)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--tgt-lang",
        metavar="LANG",
        help="the language to translate into: needed by a multilingual model (data.directions), "
        "checked against a bilingual one",
    )
    parser.add_argument(
        "--src-lang", metavar="LANG", help="the input's language, checked against the model's languages"
    )
    add_engine_args(parser)
    parser.add_argument(
        "--ref",
        metavar="FILE",
        help="score the translations against this reference file (one line per input line); "
        "scores go to standard error",
    )
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


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Engine, n-best, sampling and output-format options (shared with scripts/serve.py)."""
    parser.add_argument(
        "--engine", choices=ENGINES, help="default: ct2 for an exported directory, else torch"
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: the engine's choice)")
    add_compile_arg(parser)
    add_ensemble_arg(parser)
    parser.add_argument("--nbest", type=int, default=1, help="hypotheses per input, best first (<= --beam)")
    parser.add_argument("--sample", metavar="topk:K|topp:P", help="sample instead of beam search")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed: same seed, same output")
    parser.add_argument(
        "--format",
        choices=("text", "jsonl"),
        default="text",
        help="text: the best translation per line; jsonl: input, hypotheses, scores (and alignment)",
    )


def add_compile_arg(parser: argparse.ArgumentParser) -> None:
    """``--compile auto|aot|off`` for the torch engine's decoding, shared with scripts/serve.py."""
    parser.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        default="auto",
        help="torch engine on a CPU: decode through AOTInductor packages (built once per machine, ~15 s "
        "each, kept in ~/.cache/attn-mt/aot): aot always, off never, auto (default) once they pay for "
        "themselves on what is being translated (a server builds them before it listens)",
    )


def add_ensemble_arg(parser: argparse.ArgumentParser) -> None:
    """``--ensemble CKPT`` (repeatable), shared with scripts/serve.py."""
    parser.add_argument(
        "--ensemble",
        metavar="CKPT",
        action="append",
        default=[],
        help="another checkpoint with the same vocabulary to decode with MODEL as one ensemble "
        "(per-token probabilities averaged); repeat for more",
    )


def search_settings(args: argparse.Namespace) -> SearchSettings:
    """The decoding the command line asks for; a bad value raises ValueError naming it."""
    sampling = (
        Sampling.parse(args.sample, temperature=args.temperature, seed=args.seed) if args.sample else None
    )
    return SearchSettings(
        beam=args.beam,
        alpha=args.length_penalty,
        length_norm=getattr(args, "length_norm", None),
        max_len=args.max_len,
        batch_size=args.batch_size,
        nbest=args.nbest,
        sampling=sampling,
        target_lang=getattr(args, "tgt_lang", None),
    )


@dataclass(frozen=True)
class PlotSettings:
    """Where and what ``--plot-attention`` draws."""

    directory: Path
    layer: int | None = None
    head: int | None = None


def translate_group(
    engine: Engine,
    group: list[str],
    settings: SearchSettings,
    *,
    first_line: int,
    on_truncate: Callable[[int, int], None],
    plots: PlotSettings | None,
    jsonl: bool = False,
) -> list[str]:
    """Output lines for ``group``; with ``plots``, also one heatmap per non-empty line."""
    if jsonl:
        found = engine.translate_nbest(group, settings, on_truncate, details=True)
        lang = settings.target_lang
        return [jsonl_record(line, hyps, lang) for line, hyps in zip(group, found, strict=True)]
    if plots is None:
        return engine.translate(group, settings, on_truncate=on_truncate)
    from app.inference.plot import plot_file_name, save_attention_plot  # matplotlib: only when plotting

    maps = engine.attention_maps(group, settings, layer=plots.layer, head=plots.head, on_truncate=on_truncate)
    for index, attention in enumerate(maps):
        if attention is not None:
            line = first_line + index
            title = f"line {line}: {attention.translation}"
            path = plots.directory / plot_file_name(line)
            try:
                save_attention_plot(attention, path, title=title)
            except OSError as err:
                raise OutputError.of(f"the attention plot {path}", err) from None
    return ["" if m is None else m.translation for m in maps]


def translate_stream(
    engine: Engine,
    lines: Iterable[str],
    out: TextIO,
    settings: SearchSettings,
    *,
    interactive: bool = False,
    plots: PlotSettings | None = None,
    jsonl: bool = False,
    buffer_size: int | None = None,
) -> int:
    """Translate ``lines`` to ``out``, one line each; returns how many lines were written.

    Lines are read ``buffer_size`` at a time (default ``8 * settings.batch_size``; 1 when
    ``interactive``), each group translated and flushed to ``out`` before the next is read.
    """
    written = 0
    size = buffer_size or (1 if interactive else settings.batch_size * 8)
    for group in chunks(lines, size):
        offset = written

        def warn_truncated(index: int, length: int, offset: int = offset) -> None:
            print(
                f"warning: line {offset + index + 1}: {length} subwords exceed the model's limit of "
                f"{engine.max_source_tokens}; truncated",
                file=sys.stderr,
            )

        texts = translate_group(
            engine,
            group,
            settings,
            first_line=offset + 1,
            on_truncate=warn_truncated,
            plots=plots,
            jsonl=jsonl,
        )
        for text in texts:
            out.write(text.replace("\n", " ") + "\n")
            written += 1
        out.flush()
    return written


def main(argv: list[str] | None = None) -> int:
    """``translate.py``'s exit status: 0 done (or a reader that went away, ``| head -1``), 2 a bad argument,
    model, input or output (one ``error:`` line, no traceback), 130 interrupted (Ctrl-C, quietly; ``-o
    FILE`` is left as it was, since it is only replaced once every line is written)."""
    args = parse_args(argv)
    try:
        return translate_command(args)
    # a bad checkpoint, input, output (OutputError) or setting, an attention layer the model lacks
    except (CheckpointError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`| head -1`): nothing more to do
        silence_stdout()
        return 0
    except KeyboardInterrupt:
        return 130


def translate_command(args: argparse.Namespace) -> int:
    """Check the arguments, open the input, the output and the model (in that order: the cheap checks
    first), then translate; a mistake raises ValueError naming it."""
    if args.buffer_size is not None and args.buffer_size < 1:
        raise ValueError(f"--buffer-size must be >= 1, got {args.buffer_size}")
    if args.ref and (args.plot_attention or args.format == "jsonl"):
        raise ValueError(
            "--ref writes plain translations: it cannot be combined with --plot-attention or jsonl"
        )
    settings = search_settings(args)
    plots = plot_settings(args)
    with ExitStack() as stack:  # an error inside leaves -o FILE as it was (see output_file)
        lines = input_lines(args, stack)
        out = stack.enter_context(output_file(args.output))
        engine = open_engine(
            args.checkpoint,
            engine=args.engine,
            device=args.device,
            threads=args.threads,
            ensemble=args.ensemble,
            compile=args.compile,
        )
        if engine.languages is not None:  # a named language is checked; without --tgt-lang, a multilingual
            engine.languages.tag(args.tgt_lang, args.src_lang, required=False)  # model's lines bring tags
        if args.ref:
            evaluation = score_against_reference(engine, list(lines), args, settings, out)
            print(format_evaluation(evaluation), file=sys.stderr)
        else:
            interactive = not args.sentences and not args.input and sys.stdin.isatty()
            translate_stream(
                engine,
                lines,
                out,
                settings,
                interactive=interactive,
                plots=plots,
                jsonl=args.format == "jsonl",
                buffer_size=args.buffer_size,
            )
    if (report := engine.compile_report()) is not None:
        print(report, file=sys.stderr)
    return 0


def plot_settings(args: argparse.Namespace) -> PlotSettings | None:
    """What ``--plot-attention`` asks for, its directory made now: one that cannot be is named before
    any model is loaded."""
    if not args.plot_attention:
        return None
    directory = Path(args.plot_attention)
    if directory.exists() and not directory.is_dir():
        raise OutputError(f"--plot-attention {directory} is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError.of(f"--plot-attention directory {directory}", err) from None
    return PlotSettings(directory, layer=args.attention_layer, head=args.attention_head)


def input_lines(args: argparse.Namespace, stack: ExitStack) -> Iterable[str]:
    """The sentences given as arguments, else the lines of ``-i FILE``, else standard input."""
    if args.sentences:
        return [s.replace("\n", " ") for s in args.sentences]
    if args.input:
        try:
            return decode_lines(stack.enter_context(open(args.input, "rb")), sys.stderr)
        except OSError as err:
            raise ValueError(f"cannot read {args.input}: {err.strerror}") from None
    return decode_lines(sys.stdin.buffer, sys.stderr)


def input_name(args: argparse.Namespace) -> str:
    """How error messages name the input: the file, the command-line sentences, or standard input."""
    if args.sentences:
        return "the command-line sentences"
    return args.input or "standard input"


def score_against_reference(
    engine: Engine,
    sentences: list[str],
    args: argparse.Namespace,
    settings: SearchSettings,
    out: TextIO,
) -> Evaluation:
    """Translate all ``sentences`` at once, write them to ``out`` and score them against ``args.ref``."""
    try:
        with open(args.ref, "rb") as handle:
            references = list(decode_lines(handle, sys.stderr))
    except OSError as err:
        raise ValueError(f"cannot read reference file {args.ref}: {err.strerror}") from err
    if len(references) != len(sentences):
        raise ValueError(
            f"{input_name(args)} has {len(sentences)} lines but reference file {args.ref} has "
            f"{len(references)}; they must match line for line"
        )

    def warn_truncated(index: int, length: int) -> None:
        print(
            f"warning: line {index + 1}: {length} subwords exceed the model's limit of "
            f"{engine.max_source_tokens}; truncated",
            file=sys.stderr,
        )

    evaluation = evaluate(
        engine, sentences, references, settings, test_set=args.ref, on_truncate=warn_truncated
    )
    for text in evaluation.hypotheses:
        out.write(text.replace("\n", " ") + "\n")
    out.flush()
    return evaluation


def format_evaluation(evaluation: Evaluation) -> str:
    """Scores and speed on one line each, for standard error."""
    scores, speed = evaluation.scores, evaluation.speed()
    assert scores is not None  # evaluate() was given references
    return (
        f"BLEU {scores.bleu:.2f} | BLEU lc {scores.bleu_lc:.2f} | chrF {scores.chrf:.2f} "
        f"| {scores.signature}\n"
        f"{speed['sentences']} sentences in {speed['seconds']} s: {speed['sentences_per_s']} sentences/s, "
        f"{speed['tokens_per_s']} target tokens/s, {speed['threads']} threads on {speed['device']}"
    )
