"""The ablation report: sweep directories in, one row per variant out (report.md/.html/.csv/.json).

A *variant* is a run config minus its seed; its runs are the seeds. Scores are mean +- std over seeds,
the difference to the baseline variant comes from sacreBLEU's paired bootstrap resampling on the
saved test translations (``test.hyp``; pooled over the seeds both variants finished), and decoding
speed is measured here, for every variant in alternating rounds with the same threads and batch, on
each variant's best checkpoint (cached in ``decode_speed.json`` so a regenerated report is identical).
Runs whose data, model size or budget differ are never compared: they go to separate groups.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from app.attention.config import site_specs
from app.attention.registry import build_kernel
from app.reports.runs import Run, is_run_dir, read_run
from app.reports.summary import describe_attention

log = logging.getLogger(__name__)

# Keys that never make two runs different variants (a run's seed, where it wrote, how it was started).
NOT_VARIANT = ("seed", "output_dir", "resume", "skip_finished", "num_threads")
# What must be equal for runs to be compared at all: the data, the model size and the training budget.
HELD_EQUAL = {
    "data": ("data.dir", "data.files", "data.hub", "data.src_lang", "data.tgt_lang", "data.subword"),
    "model size": ("model.",),
    "budget": ("trainer.max_time", "trainer.max_steps", "trainer.max_epochs"),
}
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacreBLEU's default SACREBLEU_SEED: the same p-values as its command line
SIGNIFICANCE = 0.05


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def held_equal(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data, model-size and budget settings of a run, by kind."""
    return {
        kind: {k: v for k, v in sorted(flat.items()) if k.startswith(prefixes)}
        for kind, prefixes in HELD_EQUAL.items()
    }


# The output length over which the decoder cache's growth per generated token is averaged: kernels that
# keep a window (sparse) or a fixed-size state (linear) grow less per token the longer the output.
KV_LENGTH = 64
WEIGHT_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}


def kv_cache_bytes_per_token(
    model: dict[str, Any], attention: dict[str, Any], precision: str | None = None, length: int = KV_LENGTH
) -> int | None:
    """Decoder self-attention cache bytes per generated token, summed over the decoder layers: the
    kernel's own :meth:`~app.attention.base.AttentionKernel.cache_bytes` after ``length`` tokens, divided
    by ``length``. The cache holds the weights' dtype (fp32 unless ``precision`` is a ``*-true`` half
    one: mixed precision keeps fp32 weights, and test decoding runs without autocast). None for models
    without one (RNNs)."""
    if model.get("family", "transformer") != "transformer":
        return None
    spec = site_specs(attention)["decoder_self"]
    kernel = build_kernel(spec.kernel, **spec.options)
    heads = int(model["num_heads"])
    per_layer = kernel.cache_bytes(
        length,
        num_kv_heads=spec.num_kv_heads or heads,
        head_dim=int(model["d_model"]) // heads,
        dtype=WEIGHT_DTYPES.get(str(precision), torch.float32),
    )
    return round(int(model["decoder_layers"]) * per_layer / length)


@dataclass
class Variant:
    """The seeds of one configuration."""

    name: str
    runs: list[Run]  # finished runs, by seed

    @property
    def seeds(self) -> list[int]:
        return [int(run.config.get("seed", 0)) for run in self.runs]

    def result(self, key: str) -> list[float]:
        return [float(run.results[key]) for run in self.runs if run.results and key in run.results]

    def best_run(self) -> Run:
        """The seed with the highest test BLEU: its best checkpoint is timed and its attention drawn."""
        return max(self.runs, key=lambda run: (run.results or {}).get("test_bleu", 0.0))


@dataclass
class Group:
    """Variants that may be compared: same data, model size and budget."""

    held: dict[str, dict[str, Any]]
    variants: list[Variant]
    incomplete: list[Run]  # failed or missing jobs


def sweep_runs(sweep_dir: Path) -> list[Run]:
    """Every job directory of a sweep (or the directory itself if it is one run), sorted by name.

    Raises ValueError naming the directory, and what each job left, when no job finished.
    """
    if is_run_dir(sweep_dir):
        runs = [read_run(sweep_dir)]
    else:
        runs = [read_run(p) for p in sorted(sweep_dir.iterdir()) if p.is_dir() and is_run_dir(p)]
    if not runs:
        raise ValueError(f"{sweep_dir} holds no run directories (no */.hydra/config.yaml)")
    if not any(run.status == "finished" for run in runs):
        left = "\n  ".join(run.what_it_left() for run in runs)
        raise ValueError(f"no job in {sweep_dir} finished (none wrote results.json):\n  {left}")
    return runs


def group_runs(runs: list[Run]) -> tuple[list[Group], list[str]]:
    """Runs grouped by their held-equal settings, and warnings that say what differs between groups."""
    by_key: dict[str, list[Run]] = {}
    helds: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        held = held_equal(flatten(run.config))
        key = json.dumps(held, sort_keys=True, default=str)
        by_key.setdefault(key, []).append(run)
        helds[key] = held
    groups = [make_group(helds[key], members) for key, members in by_key.items()]
    warnings = []
    if len(groups) > 1:
        first = groups[0].held
        for index, group in enumerate(groups[1:], start=2):
            differ = [kind for kind in HELD_EQUAL if group.held[kind] != first[kind]]
            warnings.append(
                f"group {index} differs from group 1 in {', '.join(differ)}: reported separately, "
                "not compared"
            )
    return groups, warnings


def make_group(held: dict[str, dict[str, Any]], runs: list[Run]) -> Group:
    """Variants named by the settings that vary among the group's runs (seed and paths excluded)."""
    flats = {run.path: variant_settings(run) for run in runs}
    varying = sorted(
        {k for flat in flats.values() for k in flat if len({str(f.get(k)) for f in flats.values()}) > 1}
    )
    variants: dict[str, list[Run]] = {}
    incomplete = []
    for run in runs:
        name = variant_name(run, flats[run.path], varying)
        if run.status != "finished":
            incomplete.append(run)
            continue
        variants.setdefault(name, []).append(run)
    ordered = [
        Variant(name, sorted(members, key=lambda r: int(r.config.get("seed", 0))))
        for name, members in sorted(variants.items())
    ]
    return Group(held, ordered, incomplete)


def variant_settings(run: Run) -> dict[str, Any]:
    flat = flatten(run.config)
    return {k: v for k, v in flat.items() if k not in NOT_VARIANT}


def variant_name(run: Run, flat: dict[str, Any], varying: list[str]) -> str:
    """The attention description (which includes the head layout) plus any other swept setting
    (``sdpa kv=2``, ``eager optim.lr=0.002``)."""
    name = describe_attention(run.config.get("attention", {}))
    extra = [f"{k}={flat[k]}" for k in varying if k in flat and not k.startswith(("attention.", "heads."))]
    return " ".join([name, *extra])


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation; std is None for fewer than two values."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


@contextmanager
def sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU reads its bootstrap seed from ``SACREBLEU_SEED``; set it for one test only."""
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SACREBLEU_SEED", None)
        else:
            os.environ["SACREBLEU_SEED"] = before


def paired_bootstrap(
    baseline: list[str], system: list[str], references: list[str], *, samples: int = BOOTSTRAP_SAMPLES
) -> dict[str, float]:
    """sacreBLEU's paired bootstrap test of ``system`` against ``baseline`` (cased BLEU): the system's
    score, its bootstrap mean and 95% CI half-width, the difference and the p-value."""
    with sacrebleu_seed(BOOTSTRAP_SEED):
        test = PairedTest(
            [("baseline", baseline), ("system", system)],
            {"BLEU": BLEU()},
            [references],
            test_type="bs",
            n_samples=samples,
        )
        _, scores = test()
    base, result = scores["BLEU"]
    # sacreBLEU's p is (resamples at least as extreme + 1) / (samples + 1): identical outputs would get
    # 1 / 1001 and be marked significant (e.g. sdpa against eager, which compute the same attention)
    same = baseline == system
    return {
        "score": result.score,
        "mean": result.mean,
        "ci": result.ci,
        "delta": result.score - base.score,
        "p_value": 1.0 if same else result.p_value,
    }


def pooled_pair(
    baseline: Variant, variant: Variant, references: list[str]
) -> tuple[list[str], list[str], list[str], list[int]] | None:
    """Test translations of the seeds both variants finished, concatenated in seed order."""
    base_by_seed = {s: r.hypotheses for s, r in zip(baseline.seeds, baseline.runs, strict=True)}
    var_by_seed = {s: r.hypotheses for s, r in zip(variant.seeds, variant.runs, strict=True)}
    seeds = sorted(s for s in set(base_by_seed) & set(var_by_seed) if base_by_seed[s] and var_by_seed[s])
    if not seeds:
        return None
    base = [h for s in seeds for h in base_by_seed[s]]
    hyps = [h for s in seeds for h in var_by_seed[s]]
    if len(base) != len(hyps) or len(hyps) != len(references) * len(seeds):
        return None
    return base, hyps, references * len(seeds), seeds


def test_references(run: Run) -> list[str] | None:
    """The test-set references a run was scored against (from its data config)."""
    texts = test_texts(run)
    return texts[1] if texts else None


def test_texts(run: Run) -> tuple[list[str], list[str]] | None:
    """The test sources and references of a run's data config; None when the files are not there."""
    from app.data.corpus import read_parallel

    config = OmegaConf.create(run.config)
    src = OmegaConf.select(config, "data.files.test.src", throw_on_resolution_failure=False)
    tgt = OmegaConf.select(config, "data.files.test.tgt", throw_on_resolution_failure=False)
    if not src or not tgt or not Path(src).is_file() or not Path(tgt).is_file():
        return None
    text = read_parallel(src, tgt)
    return list(text.src), list(text.tgt)


# -- decoding speed: every variant's best checkpoint, alternating rounds ------------------------------------

DECODE_CACHE = "decode_speed.json"


def measure_decode_speed(
    variants: list[Variant],
    sources: list[str],
    *,
    rounds: int = 3,
    beams: tuple[int, ...] = (1, 5),
    batch_size: int = 64,
    threads: int = 1,
    device: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Sentences/s per variant and beam: the median of ``rounds`` passes, variants interleaved within each
    round so that machine load drifts hit them all alike. Same device, threads, batch and sentences for
    all. ``device`` defaults to the GPU when there is one (else the CPU, on ``threads`` threads)."""

    from app.inference.evaluate import evaluate
    from app.inference.translator import SearchSettings, load_translator

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(threads)
    translators = {
        v.name: load_translator(v.best_run().path / "checkpoints" / "best.ckpt", device)[0] for v in variants
    }
    timings: dict[str, dict[str, list[float]]] = {name: {} for name in translators}
    for _ in range(rounds):
        for beam in beams:
            settings = SearchSettings(beam=beam, batch_size=batch_size)
            for name, translator in translators.items():
                speed = evaluate(translator, sources, None, settings, warmup=True).sentences_per_s
                timings[name].setdefault(f"beam{beam}", []).append(speed)
    return {
        name: {key: round(statistics.median(values), 1) for key, values in per_beam.items()}
        | {"device": device, "threads": threads, "batch_size": batch_size, "rounds": rounds}
        | {"sentences": len(sources)}
        for name, per_beam in timings.items()
    }


def cache_key(runs: dict[str, Path], cache_dir: Path) -> str:
    """A measurement cache's key: each variant's run directory, relative to the cache's directory where
    it lies inside it, so a sweep directory copied elsewhere (without its checkpoints) still finds its
    measurements."""
    return json.dumps({name: os.path.relpath(path, cache_dir) for name, path in runs.items()}, sort_keys=True)


def decode_speeds(
    group: Group, cache: Path, *, limit: int | None, remeasure: bool
) -> dict[str, dict[str, float]]:
    """The group's decode speeds, read from ``cache`` when measured before for the same checkpoints."""
    key = cache_key({v.name: v.best_run().path for v in group.variants}, cache.parent)
    stored = json.loads(cache.read_text()) if cache.is_file() else {}
    if key in stored and not remeasure:
        return stored[key]
    texts = test_texts(group.variants[0].runs[0])
    if texts is None or not all(
        (v.best_run().path / "checkpoints" / "best.ckpt").is_file() for v in group.variants
    ):
        return {}
    sources = texts[0][:limit] if limit else texts[0]
    stored[key] = measure_decode_speed(group.variants, sources)
    cache.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    return stored[key]


# -- the table ---------------------------------------------------------------------------------------------

COLUMNS = (
    "variant", "seeds", "params", "kv_bytes_per_token", "steps", "train_tokens_per_s", "peak_rss_mb",
    "peak_gpu_mb", "bleu", "bleu_std", "bleu_lc", "bleu_lc_std", "chrf", "chrf_std",
    "decode_sent_s_greedy", "decode_sent_s_beam5",
    "delta_bleu", "ci95", "p_value", "significant",
    "seeds_low", "seeds_high", "p_value_seeds", "significant_seeds",
)  # fmt: skip


def variant_row(
    variant: Variant, baseline: Variant | None, references: list[str] | None, speeds: dict[str, Any]
) -> dict[str, Any]:
    """One report row: costs, mean +- std of the scores over seeds, speed, and the paired test."""
    run = variant.runs[0]
    row: dict[str, Any] = {
        "variant": variant.name,
        "seeds": len(variant.runs),
        "params": run.results.get("parameters"),
        "kv_bytes_per_token": kv_cache_bytes_per_token(
            run.config.get("model", {}),
            run.config.get("attention", {}),
            run.config.get("trainer", {}).get("precision"),
        ),
    }
    for column, key in (
        ("steps", "global_step"),
        ("train_tokens_per_s", "train_tokens_per_s"),
        ("peak_rss_mb", "peak_rss_mb"),
        ("peak_gpu_mb", "peak_gpu_mb"),
    ):
        mean, _ = mean_std(variant.result(key))
        row[column] = round(mean) if mean is not None else None
    for column in ("bleu", "bleu_lc", "chrf"):
        mean, std = mean_std(variant.result(f"test_{column}"))
        row[column] = round(mean, 2) if mean is not None else None
        row[f"{column}_std"] = round(std, 2) if std is not None else None
    speed = speeds.get(variant.name, {})
    row["decode_sent_s_greedy"], row["decode_sent_s_beam5"] = speed.get("beam1"), speed.get("beam5")
    row |= {"delta_bleu": None, "ci95": None, "p_value": None, "significant": None}
    row |= {"seeds_low": None, "seeds_high": None, "p_value_seeds": None, "significant_seeds": None}
    if baseline is None or references is None or variant is baseline or len(variant.runs) < 2:
        return row
    pair = pooled_pair(baseline, variant, references)
    if pair is None:
        return row
    test = paired_bootstrap(*pair[:3])
    row |= {
        "delta_bleu": round(test["delta"], 2),
        "ci95": round(test["ci"], 2),
        "p_value": round(test["p_value"], 4),
        "significant": test["p_value"] < SIGNIFICANCE,
    }
    return row | seed_level_test(baseline, variant, references)


def seed_level_test(baseline: Variant, variant: Variant, references: list[str]) -> dict[str, Any]:
    """The two-level (seeds and sentences) bootstrap of :mod:`app.reports.significance`, on every seed
    each variant finished: the 95% interval of the difference and its p-value."""
    from app.reports.significance import seed_and_sentence_bootstrap

    translations = [[r.hypotheses for r in v.runs if r.hypotheses] for v in (baseline, variant)]
    if any(len(seeds) < 2 for seeds in translations):
        return {}
    test = seed_and_sentence_bootstrap(*translations, references)
    return {
        "seeds_low": round(test["low"], 2),
        "seeds_high": round(test["high"], 2),
        "p_value_seeds": round(test["p_value"], 4),
        "significant_seeds": test["p_value"] < SIGNIFICANCE,
    }


def pick_baseline(variants: list[Variant], name: str | None) -> Variant | None:
    """The variant named ``name`` (default: the first MHA one, i.e. no ``kv=`` setting; for RNN
    mechanisms, which have no head layout, the first variant)."""
    if name is None:
        mha = [
            v
            for v in variants
            if "kv=" not in v.name and "mechanism" not in v.runs[0].config.get("attention", {})
        ]
        return mha[0] if mha else (variants[0] if variants else None)
    for variant in variants:
        if variant.name == name:
            return variant
    raise ValueError(f"baseline {name!r} is no variant; variants: {', '.join(v.name for v in variants)}")


# -- figures ------------------------------------------------------------------------------------------------


def band_series(runs: list[Run], x_key: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """Validation BLEU over ``x_key`` across seeds: x values every seed reached, mean, min and max."""
    import numpy as np

    from app.reports.runs import series

    curves = [series(run.metrics, x_key, "val/bleu") for run in runs]
    curves = [(xs, ys) for xs, ys in curves if xs]
    if not curves:
        return [], [], [], []
    end = min(xs[-1] for xs, _ in curves)
    grid = sorted({x for xs, _ in curves for x in xs if x <= end})
    values = np.array([np.interp(grid, xs, ys) for xs, ys in curves])  # (seeds, points)
    return grid, list(values.mean(0)), list(values.min(0)), list(values.max(0))


def curves_png(group: Group) -> bytes:
    import matplotlib.pyplot as plt

    from app.reports.figures import png_bytes

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, variant in enumerate(group.variants):
        for ax, key in zip(axes, ("step", "time/elapsed_min"), strict=True):
            grid, mean, low, high = band_series(variant.runs, key)
            if grid:
                ax.plot(grid, mean, color=f"C{index % 10}", label=variant.name)
                ax.fill_between(grid, low, high, color=f"C{index % 10}", alpha=0.2)
    for ax, label in zip(axes, ("training step", "wall-clock minutes"), strict=True):
        ax.set(xlabel=label, ylabel="validation BLEU (greedy)", title=f"BLEU by {label.split()[-1]}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


def tradeoff_png(rows: list[dict[str, Any]], x_key: str, x_label: str) -> bytes:
    """Test BLEU (mean, std error bars) against ``x_key``, one point per variant."""
    import matplotlib.pyplot as plt

    from app.reports.figures import png_bytes

    fig, ax = plt.subplots(figsize=(6, 4))
    for index, row in enumerate(rows):
        if row.get(x_key) is None or row["bleu"] is None:
            continue
        ax.errorbar(row[x_key], row["bleu"], yerr=row["bleu_std"] or 0, fmt="o", capsize=3,
                    color=f"C{index % 10}", label=row["variant"])  # fmt: skip
    ax.set(xlabel=x_label, ylabel="test BLEU (cased), mean over seeds")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


ATTENTION_SENTENCE = 0  # the test sentence (0-based line) whose cross-attention every variant draws


ATTENTION_CACHE = "attention_maps.json"


def attention_panels(variants: list[Variant], sentence: str) -> dict[str, Any]:
    """Each variant's cross-attention on ``sentence``: greedy output of the best checkpoint of its first
    seed, last decoder layer, mean over heads; a note instead where there is no checkpoint or no weights
    (approximate kernels such as linear compute none)."""
    from app.inference.translator import SearchSettings, load_translator

    panels: dict[str, Any] = {}
    for variant in variants:
        checkpoint = variant.runs[0].path / "checkpoints" / "best.ckpt"  # runs are sorted by seed
        if not checkpoint.is_file():
            panels[variant.name] = "no checkpoint"
            continue
        translator, _ = load_translator(checkpoint)
        try:
            [panels[variant.name]] = translator.translate_with_attention([sentence], SearchSettings(beam=1))
        except ValueError:  # Seq2Seq.cross_attention: the kernel approximates attention
            panels[variant.name] = "no weights"
    return panels


def panel_to_json(panel: Any) -> Any:
    """An attention map as JSON (weights rounded to 4 decimals), or the note that stands in for one."""
    if isinstance(panel, str):
        return panel
    weights = [[round(float(w), 4) for w in row] for row in panel.weights.tolist()]
    return {"translation": panel.translation, "source_tokens": panel.source_tokens,
            "target_tokens": panel.target_tokens, "weights": weights}  # fmt: skip


def panel_from_json(stored: Any) -> Any:
    from app.inference.translator import AttentionMap

    if isinstance(stored, str):
        return stored
    return AttentionMap(
        stored["translation"],
        stored["source_tokens"],
        stored["target_tokens"],
        torch.tensor(stored["weights"]),
    )


def cached_attention_panels(
    variants: list[Variant], sentence: str, cache: Path, *, remeasure: bool
) -> dict[str, Any]:
    """:func:`attention_panels`, stored in ``cache`` so that a report regenerated later (or from a copy
    of the sweep without checkpoints) draws the same figure; drawn from the stored, rounded maps always,
    so the first report and every later one are identical."""
    key = cache_key({v.name: v.runs[0].path for v in variants}, cache.parent) + f" | {sentence}"
    stored = json.loads(cache.read_text()) if cache.is_file() else {}
    if key not in stored or remeasure:
        panels = attention_panels(variants, sentence)
        if all(isinstance(panel, str) for panel in panels.values()):
            return panels  # nothing measured: keep whatever the cache holds
        stored[key] = {name: panel_to_json(panel) for name, panel in panels.items()}
        cache.write_text(json.dumps(stored, sort_keys=True) + "\n")
    return {name: panel_from_json(panel) for name, panel in stored[key].items()}


def attention_png(group: Group, cache: Path, *, remeasure: bool = False) -> bytes | None:
    """The fixed test sentence's attention maps of all variants side by side; None without test data
    or without any checkpoint or cached map."""
    from app.inference.plot import comparison_figure
    from app.reports.figures import png_bytes

    texts = test_texts(group.variants[0].runs[0]) if group.variants else None
    if texts is None or len(texts[0]) <= ATTENTION_SENTENCE:
        return None
    sentence = texts[0][ATTENTION_SENTENCE]
    panels = cached_attention_panels(group.variants, sentence, cache, remeasure=remeasure)
    if all(isinstance(panel, str) for panel in panels.values()):
        return None
    title = f"test sentence {ATTENTION_SENTENCE + 1}: {sentence} (last decoder layer, mean over heads)"
    return png_bytes(comparison_figure(panels, title=title))


# -- the report files ---------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if value is True:
        return "*"
    if value is False:
        return ""
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_rows(rows: list[dict[str, Any]]) -> str:
    from app.reports.summary import markdown_table

    return markdown_table(COLUMNS, [[cell(row[c]) for c in COLUMNS] for row in rows])


HEADLINE = ("variant", "params", "steps", "BLEU (mean ± std)", "vs baseline (95% CI)", "p sentences",
            "95% interval over seeds", "p seeds", "decode sent/s greedy / beam 5")  # fmt: skip


def headline_markdown(rows: list[dict[str, Any]]) -> str:
    """The few columns a reader compares first, formatted to be quoted as is (e.g. in a README)."""

    def plus_minus(value: Any, spread: Any, signed: bool = False) -> str:
        if value is None:
            return ""
        text = f"{value:+.2f}" if signed else f"{value:.2f}"
        return text if spread is None else f"{text} ± {spread:.2f}"

    def millions(value: Any) -> str:
        return "-" if value is None else f"{value / 1e6:.2f}M"

    lines = []
    for row in rows:
        delta = plus_minus(row["delta_bleu"], row["ci95"], signed=True)
        p_value = "" if row["p_value"] is None else f"{row['p_value']}{' *' if row['significant'] else ''}"
        interval = "" if row["seeds_low"] is None else f"{row['seeds_low']:+.2f} .. {row['seeds_high']:+.2f}"
        p_seeds = "" if row["p_value_seeds"] is None else (
            f"{row['p_value_seeds']}{' *' if row['significant_seeds'] else ''}")  # fmt: skip
        speed = f"{cell(row['decode_sent_s_greedy'])} / {cell(row['decode_sent_s_beam5'])}"
        lines.append([row["variant"], millions(row["params"]), cell(row["steps"]),
                      plus_minus(row["bleu"], row["bleu_std"]), delta, p_value, interval, p_seeds,
                      speed])  # fmt: skip
    from app.reports.summary import markdown_table

    return markdown_table(HEADLINE, lines)


def header_lines(group: Group, baseline: Variant | None, speeds: dict[str, Any]) -> list[str]:
    """What was held equal, how the comparison was made, which jobs are missing."""

    budget = {k.removeprefix("trainer."): v for k, v in group.held["budget"].items() if v is not None}
    lines = [
        f"- data: {json.dumps(group.held['data'], default=str)}",
        f"- model size: {json.dumps(group.held['model size'], default=str)}",
        f"- budget: {json.dumps(budget)} (training stops at whichever is reached first)",
        f"- trained on: {trained_on(group)}",
        f"- decoding speed: {decode_conditions(speeds)}",
        f"- kv_bytes_per_token: decoder self-attention cache bytes per generated token, all layers, "
        f"averaged over a {KV_LENGTH}-token output (each kernel's cache_bytes; window and fixed-state "
        "kernels grow less)",
        f"- baseline: {baseline.name if baseline else 'none'}; difference: cased test BLEU, sacreBLEU paired "
        f"bootstrap ({BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}) pooled over the seeds both "
        f"variants finished; ci95 = half-width of the variant's 95% interval; * = p < {SIGNIFICANCE}",
        "- p seeds: a two-level bootstrap (app/reports/significance.py) that resamples the seeds of each "
        "variant as well as the test sentences, so it asks whether the *recipes* differ, not only these "
        "trained systems; its 95% interval is of the difference in cased BLEU",
    ]
    single = [v.name for v in group.variants if len(v.runs) < 2]
    if single:
        lines.append(f"- single seed (no std, no p-value): {', '.join(single)}")
    for run in group.incomplete:
        lines.append(f"- {run.status} job: {run.what_it_left()}")
    return lines


def trained_on(group: Group) -> str:
    """The machines the group's runs recorded (results.json ``machine``), and how many jobs of their
    sweep ran at a time; runs from before that record say where they decoded the test set."""
    machines, jobs = set(), set()
    for run in (run for variant in group.variants for run in variant.runs):
        results = run.results or {}
        machine = results.get("machine")
        if machine:
            accelerator = "" if machine["device"] == "cpu" else f"{machine['device']}, "
            cpu = f"{machine['cpu_model']} ({machine['threads']} threads)"
            machines.add(f"{accelerator}{cpu}, torch {machine['torch']}")
        else:
            decoded_on = results.get("test_decode_device", "?")
            machines.add(f"not recorded by these runs (test decoded on {decoded_on})")
        jobs.add(jobs_at_a_time(run.path.parent))
    parallel = "; ".join(f"{n} job(s) at a time" for n in sorted(jobs, key=str) if n is not None)
    return "; ".join(sorted(machines)) + (f"; {parallel}" if parallel else "")


def jobs_at_a_time(sweep_dir: Path) -> int | None:
    """``hydra.launcher.n_jobs`` of the sweep that wrote ``sweep_dir`` (None for a plain run)."""
    config = sweep_dir / "multirun.yaml"
    if not config.is_file():
        return None
    return OmegaConf.select(OmegaConf.load(config), "hydra.launcher.n_jobs", default=None)


def decode_conditions(speeds: dict[str, Any]) -> str:
    """How the decoding speeds were timed (the same for every variant), or why there are none."""
    if not speeds:
        return "not measured (no best.ckpt of every variant, or no test files, where the report ran)"
    any_variant = next(iter(speeds.values()))
    return (
        f"best checkpoint of each variant on {any_variant.get('device', 'cpu')}, "
        f"{any_variant['threads']} thread(s), batch {any_variant['batch_size']}, "
        f"{any_variant['sentences']} test sentences, median of {any_variant['rounds']} alternating rounds"
    )


def write_report(
    sweep_dirs: list[Path],
    out_dir: Path | None = None,
    *,
    baseline: str | None = None,
    decode_limit: int | None = None,
    remeasure: bool = False,
) -> list[Path]:
    """report.md, report.html, report.csv, report.json and the figures for ``sweep_dirs`` (into ``out_dir``,
    default the first sweep dir). Raises ValueError for a sweep without a finished job."""
    import csv

    from app.reports.figures import data_uri

    out_dir = out_dir or sweep_dirs[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [run for sweep in sweep_dirs for run in sweep_runs(sweep)]
    groups, warnings = group_runs(runs)
    for warning in warnings:
        log.warning(warning)
    md = ["# Ablation report", "", *[f"> warning: {w}" for w in warnings]]
    html = ["<!doctype html><html><head><meta charset='utf-8'><title>Ablation report</title></head><body>",
            "<h1>Ablation report</h1>", *[f"<p><b>warning:</b> {w}</p>" for w in warnings]]  # fmt: skip
    all_rows: list[dict[str, Any]] = []
    figures: list[Path] = []
    for number, group in enumerate(groups, start=1):
        base = pick_baseline(group.variants, baseline)
        references = test_references(group.variants[0].runs[0]) if group.variants else None
        speeds = decode_speeds(group, out_dir / DECODE_CACHE, limit=decode_limit, remeasure=remeasure)
        rows = [variant_row(v, base, references, speeds) for v in group.variants]
        all_rows += [{"group": number, **row} for row in rows]
        pngs = {
            f"group{number}_curves.png": curves_png(group),
            f"group{number}_bleu_vs_speed.png": tradeoff_png(
                rows, "decode_sent_s_beam5", "decode sentences/s, beam 5"
            ),
            f"group{number}_bleu_vs_memory.png": tradeoff_png(
                rows, "kv_bytes_per_token", "KV-cache bytes per token"
            ),
        }
        attention = attention_png(group, out_dir / ATTENTION_CACHE, remeasure=remeasure)
        if attention is not None:
            pngs[f"group{number}_attention.png"] = attention
        for name, data in pngs.items():
            (out_dir / name).write_bytes(data)
            figures.append(out_dir / name)
        header = header_lines(group, base, speeds)
        md += ["", f"## Group {number}", "", *header, "", headline_markdown(rows), "", "All columns:", ""]
        md += [markdown_rows(rows), ""]
        md += [f"![{name}]({name})" for name in pngs]
        html += [f"<h2>Group {number}</h2>", "<ul>", *[f"<li>{line[2:]}</li>" for line in header], "</ul>"]
        html.append(html_table(rows))
        html += [f"<p><img alt='{name}' src='{data_uri(data)}'></p>" for name, data in pngs.items()]
    html.append("</body></html>")
    paths = [out_dir / name for name in ("report.md", "report.html", "report.csv", "report.json")]
    paths[0].write_text("\n".join(md) + "\n", encoding="utf-8")
    paths[1].write_text("\n".join(html) + "\n", encoding="utf-8")
    with paths[2].open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["group", *COLUMNS])
        writer.writeheader()
        writer.writerows(all_rows)
    incomplete = [{"path": str(r.path), "status": r.status} for g in groups for r in g.incomplete]
    report = {"warnings": warnings, "rows": all_rows, "incomplete": incomplete}
    paths[3].write_text(json.dumps(report, indent=1) + "\n")
    return [*paths, *figures]


def html_table(rows: list[dict[str, Any]]) -> str:
    from html import escape

    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell(row[c]))}</td>" for c in COLUMNS) + "</tr>" for row in rows
    )
    return f"<table border='1'><tr>{head}</tr>{body}</table>"
