"""A sweep's runs as variants, and variants as groups that may be compared.

A *variant* is a run config minus its seed; its runs are the seeds. Runs whose data, model size or budget
differ are never compared: they go to separate groups, and a warning says what differs. Each variant is
named by its attention (with the head layout) and any other setting swept beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
from omegaconf import OmegaConf

from app.attention.config import describe_attention
from app.data.concat import concat_pairs
from app.data.corpus import read_parallel
from app.reports.runs import RunRecord, read_runs
from app.rundir import CONFIG, RESULTS

# Keys that never make two runs different variants (a run's seed, where it wrote, how it was started;
# a warm start's checkpoint is held equal as its "start", see :func:`start_of`).
NOT_VARIANT = ("seed", "output_dir", "resume", "skip_finished", "num_threads", "init_from", "from_sweep")
# What must be equal for runs to be compared at all: the data, the model size and the training budget.
HELD_EQUAL = {
    "data": ("data.dir", "data.files", "data.hub", "data.src_lang", "data.tgt_lang", "data.subword"),
    "model size": ("model.",),
    "budget": ("trainer.max_time", "trainer.max_steps", "trainer.max_epochs"),
    "input length": ("data.concat",),  # a length sweep: one group per length (app/reports/lengths.py)
}
START = "start"  # a further held kind: scratch, or the warm start (init_from) a run's weights came from


def start_of(flat: dict[str, Any]) -> dict[str, Any]:
    """Where a run's weights started: ``{}`` from scratch; ``{"from_sweep": D}`` for a fine-tune arm
    (experiment=ablation_length_finetune: each job's ``init_from`` is derived from ``D`` and its own
    attention and seed, so the sweep, not the per-job path, is what its runs hold equal);
    ``{"init_from": CKPT}`` for any other warm start. Runs that start differently are never compared."""
    if flat.get("from_sweep"):
        return {"from_sweep": flat["from_sweep"]}
    return {"init_from": flat["init_from"]} if flat.get("init_from") else {}


def describe_start(start: dict[str, Any]) -> str:
    """:func:`start_of` in words, for report headers."""
    if "from_sweep" in start:
        return (
            f"fine-tuned: each job from the best checkpoint of its attention and seed at data.concat=1 "
            f"of {start['from_sweep']}"
        )
    return f"warm start from {start['init_from']}" if start else "from scratch"


@dataclass
class Variant:
    """The seeds of one configuration."""

    name: str
    runs: list[RunRecord]  # finished runs, by seed

    @property
    def seeds(self) -> list[int]:
        return [int(run.config.get("seed", 0)) for run in self.runs]

    def result(self, key: str) -> list[float]:
        return [float(run.results[key]) for run in self.runs if run.results and key in run.results]

    def best_run(self) -> RunRecord:
        """The seed with the highest test BLEU: its best checkpoint is timed."""
        return max(self.runs, key=lambda run: (run.results or {}).get("test_bleu", 0.0))


@dataclass
class Group:
    """Variants that may be compared: same data, model size and budget."""

    held: dict[str, dict[str, Any]]
    variants: list[Variant]
    incomplete: list[RunRecord]  # failed or missing jobs


def attention_name(attention: dict[str, Any]) -> str:
    """A run's attention as reports name it: :func:`app.attention.config.describe_attention` (the kernel
    with head layout and options, ``sdpa kv=2``, or the RNN decoder and score function, ``luong
    general``); a config this version cannot parse is shown by its kernel or mechanism name."""
    try:
        return describe_attention(attention)
    except ValueError:
        return str(attention.get("kernel") or attention.get("mechanism") or "?")


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
    """The data, model-size, budget, input-length and start settings of a run, by kind."""
    held = {
        kind: {k: v for k, v in sorted(flat.items()) if k.startswith(prefixes)}
        for kind, prefixes in HELD_EQUAL.items()
    }
    return held | {START: start_of(flat)}


def sweep_runs(sweep_dir: Path) -> list[RunRecord]:
    """Every job of a sweep, sorted by name: its job directories or its compact record's jobs (or the
    run itself where ``sweep_dir`` is one run).

    Raises ValueError naming the directory, and what each job left, when no job finished.
    """
    runs = read_runs(sweep_dir)
    if not runs:
        raise ValueError(f"{sweep_dir} holds no run directories (no */{CONFIG}) and no compact record")
    if not any(run.status == "finished" for run in runs):
        left = "\n  ".join(run.what_it_left() for run in runs)
        raise ValueError(f"no job in {sweep_dir} finished (none wrote {RESULTS}):\n  {left}")
    return runs


def group_runs(runs: list[RunRecord]) -> tuple[list[Group], list[str]]:
    """Runs grouped by their held-equal settings, and warnings that say what differs between groups."""
    by_key: dict[str, list[RunRecord]] = {}
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
            differ = [kind for kind in (*HELD_EQUAL, START) if group.held[kind] != first[kind]]
            warnings.append(
                f"group {index} differs from group 1 in {', '.join(differ)}: reported separately, "
                "not compared"
            )
    return groups, warnings


def make_group(held: dict[str, dict[str, Any]], runs: list[RunRecord]) -> Group:
    """Variants named by the settings that vary among the group's runs (seed and paths excluded)."""
    flats = {run.path: variant_settings(run) for run in runs}
    varying = sorted(
        {k for flat in flats.values() for k in flat if len({str(f.get(k)) for f in flats.values()}) > 1}
    )
    variants: dict[str, list[RunRecord]] = {}
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


def variant_settings(run: RunRecord) -> dict[str, Any]:
    """A run's flattened config without the keys that never make a variant (:data:`NOT_VARIANT`)."""
    flat = flatten(run.config)
    return {k: v for k, v in flat.items() if k not in NOT_VARIANT}


def variant_name(run: RunRecord, flat: dict[str, Any], varying: list[str]) -> str:
    """The attention description (which includes the head layout) plus any other swept setting
    (``sdpa kv=2``, ``eager optim.lr=0.002``)."""
    name = attention_name(run.config.get("attention", {}))
    extra = [f"{k}={flat[k]}" for k in varying if k in flat and not k.startswith(("attention.", "heads."))]
    return " ".join([name, *extra])


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


def test_pairs(run: RunRecord) -> tuple[list[str], list[str]] | None:
    """The test sentence pairs (sources, references) of a run's data config, one sentence a line, before
    any joining (``data.concat``); None when the files are not there."""
    config = OmegaConf.create(run.config)
    src = OmegaConf.select(config, "data.files.test.src", throw_on_resolution_failure=False)
    tgt = OmegaConf.select(config, "data.files.test.tgt", throw_on_resolution_failure=False)
    if not src or not tgt or not Path(src).is_file() or not Path(tgt).is_file():
        return None
    text = read_parallel(src, tgt)
    return list(text.src), list(text.tgt)


def joined(pairs: tuple[list[str], list[str]], k: int) -> tuple[list[str], list[str]]:
    """Sources and references as examples of ``k`` pairs each (:func:`app.data.concat.concat_pairs`)."""
    if k == 1:
        return pairs
    examples = concat_pairs(datasets.Dataset.from_dict({"src": pairs[0], "tgt": pairs[1]}), k)
    return list(examples["src"]), list(examples["tgt"])


def jobs_at_a_time(sweep_dir: Path) -> int | None:
    """``hydra.launcher.n_jobs`` of the sweep that wrote ``sweep_dir`` (None for a plain run)."""
    config = sweep_dir / "multirun.yaml"
    if not config.is_file():
        return None
    return OmegaConf.select(OmegaConf.load(config), "hydra.launcher.n_jobs", default=None)
