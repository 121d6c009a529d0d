"""The Markdown that ``scripts/bench_engines.py`` prints (:mod:`app.bench.engines` measures): the command
and the machine, one table line per (kernel, engine, threads, beam), and with ``--kernels`` what each
kernel name became (its attention, whose weights, what could not run and why)."""

from __future__ import annotations

from typing import Any

from app.bench.engine_kernels import KernelVariant


def table_line(cells: list[Any]) -> str:
    """A Markdown table line; a ``|`` inside a cell (error messages list choices with it) is escaped."""
    return "| " + " | ".join("" if c is None else str(c).replace("|", "\\|") for c in cells) + " |"


def speed_table(result: dict[str, Any]) -> str:
    """One line per (kernel, engine, threads, beam): batch-1 latency beside full-batch throughput, mean
    output length and BLEU; with ``--kernels``, each kernel's weights, skipped kernels and notes."""
    kernels = {name: KernelVariant.from_json(info) for name, info in result.get("kernels", {}).items()}
    merged: dict[tuple[str | None, str, int, int], dict[str, Any]] = {}
    for row in sorted(result["rows"], key=lambda r: r["batch"]):  # the largest batch's mean length wins
        merged.setdefault((row.get("kernel"), row["engine"], row["threads"], row["beam"]), {}).update(row)
    order = list(kernels)
    head = [
        "engine",
        "threads",
        "beam",
        "batch 1 ms/sent",
        "batch N sent/s",
        "batch N tok/s",
        "mean len",
        "BLEU",
    ]
    head = ["kernel", "weights", *head] if kernels else head
    left = 3 if kernels else 1  # text columns; the numbers align right
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * left + "---:|" * (len(head) - left)]
    keys = sorted(merged, key=lambda k: (k[2], k[3], order.index(k[0]) if k[0] in order else 0, k[1]))
    for kernel, engine, threads, beam in keys:
        row = merged[kernel, engine, threads, beam]
        numbers = ("ms_per_sentence", "sentences_per_s", "tokens_per_s", "mean_output_length", "bleu")
        cells = [*([kernel, kernels[kernel].weights_cell()] if kernels else []), engine, threads, beam]
        cells += [row.get(key) for key in numbers]
        lines.append(table_line(cells))
    skipped = [v for v in kernels.values() if v.skipped is not None]
    lines += [table_line([v.name, v.weights_cell(), *[None] * (len(head) - 2)]) for v in skipped]
    agreement = result["ct2_fp32_greedy_equals_torch_percent"]
    if agreement is not None:
        lines.append(f"\nCT2 float32 greedy == torch float32 greedy on {agreement}% of lines.")
    lines.append("\nmean len: target subwords per sentence, EOS included (of the largest batch).")
    if kernels:
        lines.append(
            "Swapped weights were trained with another attention: outputs, and so their lengths, differ "
            "from a model trained with the kernel; compare tok/s, or pass --checkpoint-for KERNEL=CKPT.\n"
        )
        lines += [variant.note() for variant in kernels.values()]
        for name, info in result["kernels"].items():
            if (equal := info["ct2_fp32_greedy_equals_torch_percent"]) is not None:
                lines.append(f"- `{name}`: CT2 float32 greedy == torch float32 greedy on {equal}% of lines")
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    """The Markdown output: the command, the machine, then :func:`speed_table`."""
    flags = ", ".join(result["cpu_flags"]) or "none of avx2, avx512f, bf16, amx"
    rounds = result["config"]["rounds"]
    compiled = result.get("compile_report")
    return (
        f"Command: `{result['command']}`\n\n"
        f"CPU: {result['cpu']} (flags: {flags}; fast bf16: {result['cpu_has_fast_bf16']}); "
        f"torch {result['torch']}, ctranslate2 {result['ctranslate2']}. {result['sentences']} sentences of "
        f"`{result['source']}`; medians of {rounds} round{'s' * (rounds != 1)}, the order rotating.\n\n"
        + (
            f"Torch engines, compile={result['config'].get('compile', 'off')}: {compiled}.\n\n"
            if compiled
            else ""
        )
        + speed_table(result)
    )
