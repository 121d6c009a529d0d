"""The attention benchmark's figure (:mod:`app.bench.attention`): four log-log panels against length
drawn from its CSV rows. Matplotlib runs with the file-only Agg backend."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from app.bench.memory import PEAK_UNMEASURED
from app.reports.figures import PNG_METADATA, compact_png


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Four log-log panels against length: fwd+bwd time, peak memory, decoding step time, cache size.

    A case keeps its colour in every panel; in the decoding panel solid lines are cached decoding
    and dashed lines recomputation.
    """
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    train = [r for r in rows if r["bench"] == "train" and r["status"].startswith("ok")]
    decode = [r for r in rows if r["bench"] == "decode"]
    cached = [r for r in decode if r["mode"] == "cached"]
    names = list(dict.fromkeys(r["variant"] for r in rows))
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    panels = [
        (axes[0, 0], train, "time_ms", 1.0, "forward + backward time (ms)", "sequence length"),
        (axes[0, 1], train, "peak_bytes", 2**-20, "peak memory (MiB)", "sequence length"),
        (axes[1, 0], decode, "time_ms", 1.0, "decoding time per step (ms)", "target length"),
        (axes[1, 1], cached, "cache_bytes", 2**-10, "cache after L positions (KiB)", "target length L"),
    ]
    for ax, subset, key, scale, ylabel, xlabel in panels:
        for (name, mode), points in series(subset, key).items():
            xs, ys = zip(*points, strict=True)
            label = f"{name} ({mode})" if subset is decode else name
            style = "--" if mode == "recompute" else "-"
            ys = [y * scale for y in ys]
            ax.plot(xs, ys, style, color=colours[name], marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3, which="both")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, metadata=PNG_METADATA)
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(compact_png(buffer.getvalue()))


def series(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """{(case name, mode): [(length, value)]} over the rows with a positive value of ``key``."""
    lines: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in rows:
        value = row.get(key)
        if value in ("", None, PEAK_UNMEASURED) or float(value) <= 0:
            continue
        lines.setdefault((row["variant"], row["mode"]), []).append((float(row["length"]), float(value)))
    return lines


def title_of(rows: list[dict[str, Any]]) -> str:
    """The plot title: where and with what settings the rows were measured."""
    if not rows:
        return "no measurements"
    r = rows[0]
    return (
        f"{r['hardware']} ({r['device']}, {r['dtype']}, {r['threads']} threads, torch {r['torch']}): "
        f"batch {r['batch']}, d_model {r['d_model']}, {r['heads']} heads"
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV the benchmark wrote (for ``--plot-only``)."""
    with path.open() as handle:
        return list(csv.DictReader(handle))
