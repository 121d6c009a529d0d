"""A Markdown table of finished runs: the model and attention each used, its test scores and costs.

    python scripts/summarize_runs.py runs/ablation_8min/*          # one row per Hydra run directory

Reads ``<run>/results.json`` (written at the end of training) and ``<run>/.hydra/config.yaml`` (what was
trained). Runs without a results.json are listed as unfinished, never dropped silently.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

COLUMNS = (
    "run",
    "model",
    "attention",
    "params",
    "BLEU",
    "BLEU lc",
    "chrF",
    "steps",
    "train min",
    "train tok/s",
    "test sent/s",
    "peak RSS MB",
)


def describe_attention(attention: dict[str, Any]) -> str:
    """The kernel with head layout and options (``sdpa kv=2``, ``sparse sliding_window window=8``), or the
    RNN decoder and score function (``luong general``)."""
    if "mechanism" in attention:  # an RNN score function
        return f"{attention['decoder']} {attention['mechanism']}"
    parts = [str(attention.get("kernel", "?"))]
    if attention.get("num_kv_heads"):
        parts.append(f"kv={attention['num_kv_heads']}")
    kernel = parts[0]
    if kernel == "sparse":
        parts.append(f"{attention.get('pattern')} window={attention.get('window')}")
    elif kernel == "linear":
        parts.append(str(attention.get("feature_map")))
    elif kernel == "flash":
        parts.append(f"backend={attention.get('backend')}")
    return " ".join(parts)


def describe_model(model: dict[str, Any]) -> str:
    name = str(model.get("family", "transformer"))
    if "cell" in model:
        return f"{name} {model['cell']}"
    return name


def row(run_dir: Path) -> list[str]:
    config = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=False)
    model, attention = config.get("model", {}), config.get("attention", {})
    cells = [run_dir.name, describe_model(model), describe_attention(attention)]
    results_file = run_dir / "results.json"
    if not results_file.is_file():
        return [*cells, "unfinished"] + [""] * (len(COLUMNS) - len(cells) - 1)
    r = json.loads(results_file.read_text())
    return [
        *cells,
        f"{r['parameters'] / 1e6:.2f}M",
        f"{r['test_bleu']:.2f}",
        f"{r['test_bleu_lc']:.2f}",
        f"{r['test_chrf']:.1f}",
        str(r.get("global_step", "")),
        f"{r['fit_seconds'] / 60:.1f}" if "fit_seconds" in r else "",
        f"{r['train_tokens_per_s']:,}" if "train_tokens_per_s" in r else "",
        f"{r['test_decode_sentences_per_s']:.1f}" if "test_decode_sentences_per_s" in r else "",
        f"{r['peak_rss_mb']:,}" if "peak_rss_mb" in r else "",
    ]


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="Hydra run directories")
    args = parser.parse_args()
    runs = [run for run in args.runs if (run / ".hydra" / "config.yaml").is_file()]
    skipped = sorted(set(args.runs) - set(runs))
    if skipped:
        parser.error(f"not Hydra run directories (no .hydra/config.yaml): {', '.join(map(str, skipped))}")
    print(markdown([row(run) for run in runs]))


if __name__ == "__main__":
    main()
