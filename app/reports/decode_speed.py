"""How fast each variant decodes, measured by the report, and cached per variant beside it.

Every variant's best checkpoint decodes the same test text with the same device, threads, batch and
beams, the variants alternating within each round so that machine load drifts hit them all alike; the
median over rounds is reported. Speed is counted in *original test sentences* per second: a run of a
length sweep (``data.concat=K``) decodes examples of K joined pairs, and an example counts K sentences,
so the column means the same at every length. ``decode_limit`` bounds the cost in the same unit: the
first N test sentence pairs, i.e. ceil(N / K) examples, the same text at every K.

The timings are cached in ``decode_speed.json`` under one key per variant (its timed run directory,
relative to the cache, and the settings), so a job added to a sweep times only its own variant, and a
copy of the sweep without checkpoints regenerates the same report. Files written before the per-variant
keys (one key per group: ``{variant: run dir}``) are still read, for the settings they were timed with.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.inference.evaluate import evaluate
from app.reports.variants import Group, Variant, joined
from app.rundir import BEST

DECODE_CACHE = "decode_speed.json"
WARMUP_TOKENS = 32  # a bounded measurement warms up on outputs cut to this many tokens


@dataclass(frozen=True)
class DecodeSettings:
    """What the report times: beam sizes, rounds (the median is reported), at most ``limit`` test
    sentence pairs (None: all), the batch, threads and the output cap (``max_len`` tokens). The
    defaults are what reports before these settings timed; a length sweep bounds them
    (conf/experiment/ablation_length.yaml)."""

    beams: tuple[int, ...] = (1, 5)
    rounds: int = 3
    limit: int | None = None
    batch_size: int = 64
    threads: int = 1
    max_len: int = 256

    def __post_init__(self) -> None:
        bad_limit = self.limit is not None and self.limit < 1
        if not self.beams or min(self.beams) < 1 or self.rounds < 1 or bad_limit:
            raise ValueError(
                f"decode beams ({list(self.beams)}) must be >= 1 and not empty, rounds ({self.rounds}) "
                f">= 1, decode_limit ({self.limit}) >= 1 or null"
            )

    @property
    def bounded(self) -> bool:
        """Whether the text timed is bounded (``limit``): then the warm-up is too (:data:`WARMUP_TOKENS`)."""
        return self.limit is not None


def sweep_settings(
    sweep_dir: Path,
    *,
    limit: int | None = None,
    beams: tuple[int, ...] | None = None,
    rounds: int | None = None,
) -> DecodeSettings:
    """The settings given, the others those of the sweep's report callback (``multirun.yaml``:
    ``hydra.callbacks.ablation_report``), else the defaults; so ``scripts/report.py SWEEP`` times a
    length sweep as its own end-of-sweep report did, and finds its cache. ``limit`` 0 means all."""
    config = sweep_dir / "multirun.yaml"
    callback = (
        OmegaConf.select(OmegaConf.load(config), "hydra.callbacks.ablation_report", default=None)
        if config.is_file()
        else None
    )
    stored = OmegaConf.to_container(callback, resolve=True) if callback is not None else {}
    assert isinstance(stored, dict)
    limit = limit if limit is not None else stored.get("decode_limit")
    return DecodeSettings(
        beams=tuple(int(beam) for beam in (beams or stored.get("beams") or DecodeSettings.beams)),
        rounds=int(rounds or stored.get("rounds") or DecodeSettings.rounds),
        limit=int(limit) if limit else None,
    )


def output_cap(group: Group) -> int:
    """The output cap (tokens) the group's runs decoded their test set with (``test_search.max_len``):
    a length sweep's long examples need their whole output, not the default 256 tokens."""
    caps = [(run.config.get("test_search") or {}).get("max_len") for v in group.variants for run in v.runs]
    return max((int(cap) for cap in caps if cap), default=DecodeSettings.max_len)


def timed_text(sources: list[str], k: int, limit: int | None) -> tuple[list[str], int]:
    """The examples to time and the sentence pairs they hold: the first ``limit`` test pairs (all when
    None), joined ``k`` to an example (ceil(limit / k) examples), so every length decodes the same text."""
    pairs = sources[:limit] if limit else sources
    return joined((pairs, pairs), k)[0], len(pairs)


def measure_decode_speed(
    variants: list[Variant],
    sources: list[str],
    *,
    pairs: int | None = None,
    settings: DecodeSettings | None = None,
    device: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Sentences/s per variant and beam: the median of ``settings.rounds`` passes over the examples
    ``sources`` (holding ``pairs`` sentence pairs, default one each), variants interleaved within each
    round. Same device, threads, batch and examples for all; ``device`` defaults to the GPU when there
    is one (else the CPU, on ``settings.threads`` threads)."""
    settings = settings or DecodeSettings()
    pairs = pairs or len(sources)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(settings.threads)
    engines = {v.name: open_engine(v.best_run().files.best, engine="torch", device=device) for v in variants}
    timings: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    for _ in range(settings.rounds):
        for beam in settings.beams:
            search = SearchSettings(beam=beam, batch_size=settings.batch_size, max_len=settings.max_len)
            for name, engine in engines.items():
                if settings.bounded:  # warm the kernels and caches without decoding a long output twice
                    engine.translate(sources[: settings.batch_size], replace(search, max_len=WARMUP_TOKENS))
                evaluation = evaluate(engine, sources, None, search, warmup=not settings.bounded)
                speed = evaluation.sentences_per_s * pairs / len(sources)  # original sentences per second
                timings[name].setdefault(f"beam{beam}", []).append(speed)
    conditions = {"device": device, "threads": settings.threads, "batch_size": settings.batch_size}
    conditions |= {"rounds": settings.rounds, "sentences": pairs}
    if len(sources) != pairs or settings.max_len != DecodeSettings.max_len:  # not in older entries
        conditions |= {"examples": len(sources), "max_len": settings.max_len}
    return {
        name: {key: round(statistics.median(values), 1) for key, values in per_beam.items()} | conditions
        for name, per_beam in timings.items()
    }


def variant_key(run_dir: Path, cache_dir: Path, settings: DecodeSettings) -> str:
    """A variant's cache key: the run directory timed (its best checkpoint), relative to the cache's
    directory where it lies inside it, and every setting that changes the timing."""
    timed = asdict(settings) | {"beams": list(settings.beams)}
    return json.dumps({"run": os.path.relpath(run_dir, cache_dir), "settings": timed}, sort_keys=True)


def group_entries(stored: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The timings of a cache file written before per-variant keys (one key per group, ``{variant:
    run dir}``), by run directory."""
    found: dict[str, dict[str, Any]] = {}
    for key, entries in stored.items():
        runs = json.loads(key)
        if "settings" not in runs:  # a per-variant key has its run and settings, a group key neither
            found |= {path: entries[name] for name, path in runs.items() if name in entries}
    return found


def cached_speed(
    stored: dict[str, Any], variant: Variant, cache_dir: Path, settings: DecodeSettings, sentences: int | None
) -> dict[str, Any] | None:
    """A variant's timing in the cache, under its own key, or (timed with today's default settings)
    under the key of a group it was timed in before per-variant keys."""
    run_dir = variant.best_run().path
    entry = stored.get(variant_key(run_dir, cache_dir, settings))
    if entry is not None or replace(settings, limit=None) != DecodeSettings():
        return entry
    older = group_entries(stored).get(os.path.relpath(run_dir, cache_dir))
    return older if older is not None and sentences in (None, older["sentences"]) else None


def decode_speeds(
    group: Group,
    sources: list[str] | None,
    k: int,
    cache: Path,
    *,
    settings: DecodeSettings,
    remeasure: bool = False,
) -> dict[str, dict[str, Any]]:
    """The group's decode speeds on its test sentences ``sources`` (one pair a line, joined ``k`` to an
    example as its runs were tested), from ``cache`` where a variant was timed before with the same
    checkpoint and settings; the others are timed now, together (none where there are no test sources
    or no best checkpoint)."""
    cache_dir = cache.parent
    sentences = None if sources is None else len(sources[: settings.limit] if settings.limit else sources)
    stored = json.loads(cache.read_text()) if cache.is_file() else {}
    speeds = {}
    for variant in group.variants:
        entry = None if remeasure else cached_speed(stored, variant, cache_dir, settings, sentences)
        if entry is not None:
            speeds[variant.name] = entry
    todo = [v for v in group.variants if v.name not in speeds and v.best_run().files.best.is_file()]
    if sources is None or not todo:
        return speeds
    examples, pairs = timed_text(sources, k, settings.limit)
    measured = measure_decode_speed(todo, examples, pairs=pairs, settings=settings)
    for variant in todo:
        stored[variant_key(variant.best_run().path, cache_dir, settings)] = measured[variant.name]
    cache.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    speeds |= measured
    return {v.name: speeds[v.name] for v in group.variants if v.name in speeds}


def describe_timing(speeds: dict[str, dict[str, Any]]) -> str:
    """How the decoding speeds were timed (one phrase per distinct set of conditions), or why there are
    none. The words of timings from before the bounded settings are unchanged."""
    if not speeds:
        return f"not measured (no {BEST} of every variant, or no test files, where the report ran)"
    phrases = []
    for entry in speeds.values():
        phrase = timing_phrase(entry)
        if phrase not in phrases:
            phrases.append(phrase)
    return "; ".join(phrases)


def timing_phrase(entry: dict[str, Any]) -> str:
    """One timing's conditions: device, threads, batch, test sentences (and examples), rounds, beams."""
    text = (
        f"best checkpoint of each variant on {entry.get('device', 'cpu')}, {entry['threads']} thread(s), "
        f"batch {entry['batch_size']}, {entry['sentences']} test sentences"
    )
    if entry.get("examples", entry["sentences"]) != entry["sentences"]:
        per = math.ceil(entry["sentences"] / entry["examples"])
        text += (
            f" (as {entry['examples']} examples of {per} joined pairs; sent/s counts sentences, not examples)"
        )
    if "max_len" in entry:
        text += f", outputs up to {entry['max_len']} tokens"
    text += (
        f", median of {entry['rounds']} alternating rounds"
        if entry["rounds"] > 1
        else ", one round (variants in turn)"
    )
    beams = sorted(int(key.removeprefix("beam")) for key in entry if key.startswith("beam"))
    named = ", ".join("greedy" if beam == 1 else f"beam {beam}" for beam in beams)
    return text if beams == [1, 5] else f"{text}, timed: {named} only"
