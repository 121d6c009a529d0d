"""The data pipeline at scale: first preparation, start-up from cache, peak memory, training throughput.

A benchmark, not a test (``scripts/bench_data.py`` is the command line). For ``--pairs N`` it writes a
synthetic corpus grown from Multi30k's training set (:mod:`app.data.synthetic`), then runs three phases,
each in a fresh process so that each peak RSS is that phase's own:

* ``prepare``: an empty cache -> datasets' Arrow conversion, sentencepiece training, tokenization with
  ``data.num_proc`` processes (``prep_s``, ``prep_peak_rss_mb``);
* ``train``: the same config with the cache now warm -> ``startup_s`` (config to the first training
  batch in hand: corpus mapping, content hashes, tokenizer and token-cache loading, filtering, batching),
  then ``--steps`` optimizer steps (``tokens_per_s``: real source + target tokens per second over the
  steps after the first ``--steps // 4``; ``peak_rss_mb`` of the training process, rank 0 under DDP,
  and ``peak_anon_rss_mb``, the same without file-backed pages: RSS counts the pages of the
  memory-mapped token cache that the process has touched, which belong to the shared page cache);
* ``loader``: the data pipeline alone from the warm cache, no model: median milliseconds per training
  batch, sentences per batch and the fraction of real (non-pad) tokens, which set the model's cost per
  token (``tokens_per_s`` compares corpora only where these agree).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from app.bench.memory import peak_rss_mb
from app.bench.runs import StepClock, bench_config
from app.bench.timing import REPO_ROOT
from app.data.synthetic import write_synthetic_corpus
from app.training.task import build_fit

DEFAULT_BASE = REPO_ROOT / "../shared/data/multi30k"


def synthetic_config(
    corpus_dir: Path, cache_dir: Path, out_dir: Path, steps: int, overrides: list[str], base: Path
) -> DictConfig:
    """``train.py``'s config on the synthetic corpus, ``steps`` steps, no validation, no files written
    (the training benchmark's bounds); valid and test come from the ``base`` Multi30k directory."""
    base = base.resolve()
    files = [
        "data=custom",
        f"data.files.train.src={corpus_dir / 'train.src'}",
        f"data.files.train.tgt={corpus_dir / 'train.tgt'}",
        f"data.files.valid.src={base / 'val.de.gz'}",
        f"data.files.valid.tgt={base / 'val.en.gz'}",
        f"data.files.test.src={base / 'test_2016_flickr.de.gz'}",
        f"data.files.test.tgt={base / 'test_2016_flickr.en.gz'}",
        f"data.cache_dir={cache_dir}",
    ]
    return bench_config([*files, *overrides, "trainer.max_epochs=null"], steps, out_dir)


def prepare_phase(cfg: DictConfig) -> dict[str, Any]:
    """Build everything up to the encoded, filtered splits; time it (the cache is expected empty)."""
    started = time.perf_counter()
    run = build_fit(cfg)
    run.datamodule.setup("fit")
    return {
        "prep_s": round(time.perf_counter() - started, 2),
        "prep_peak_rss_mb": peak_rss_mb(),
        "train_pairs_kept": len(run.datamodule.datasets["train"]),
        "train_pairs_dropped": run.datamodule.dropped_train_pairs,
    }


def loader_phase(cfg: DictConfig, steps: int) -> dict[str, Any]:
    """The data pipeline alone, from the warm cache: ``steps`` training batches with no model (median
    time per batch) and the batches' shape, which sets the model's cost per real token."""
    run = build_fit(cfg)
    run.datamodule.setup("fit")
    batches = iter(run.datamodule.train_dataloader())
    next(batches)  # the epoch's order is packed here
    times, tokens, sentences, slots = [], 0, 0, 0
    for _ in range(steps):
        started = time.perf_counter()
        batch = next(batches)
        times.append(time.perf_counter() - started)
        tokens += batch.num_tokens
        sentences += batch.sentences
        slots += batch.slots
    return {
        "loader_ms_per_batch": round(1e3 * statistics.median(times), 3),
        "sentences_per_batch": round(sentences / steps, 1),
        "real_token_fraction": round(tokens / slots, 3),
    }


def train_phase(cfg: DictConfig, steps: int) -> dict[str, Any]:
    """Start from the warm cache and train ``steps`` steps; start-up time, throughput and memory."""
    started = time.perf_counter()
    run = build_fit(cfg)
    clock = StepClock(flops=False, anon_rss=True)
    run.trainer.callbacks.append(clock)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    if not run.trainer.is_global_zero:
        return {}
    assert clock.first_batch is not None
    return {
        "startup_s": round(clock.first_batch - started, 2),
        "tokens_per_s": round(clock.tokens_per_s(warmup=steps // 4)),
        "peak_rss_mb": peak_rss_mb(),
        "peak_anon_rss_mb": clock.peak_anon_mb,
        "steps": len(clock.ends),
        "world_size": run.trainer.world_size,
        "num_workers": run.datamodule.num_workers,
        "num_proc": run.datamodule.num_proc,
    }


PHASES = {
    "prepare": lambda cfg, steps: prepare_phase(cfg),
    "train": train_phase,
    "loader": loader_phase,
}


def run_phase(phase: str, args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    """Run one phase in a fresh Python process; its JSON line on stdout is the result."""
    command = [
        sys.executable,
        "-m",
        "app.bench.data",
        "--phase",
        phase,
        "--pairs",
        str(args.pairs),
        "--steps",
        str(args.steps),
        "--work-dir",
        str(args.work_dir),
        "--base",
        str(args.base),
        *overrides,
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{phase} phase failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options, and the rest as train.py overrides."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, required=True, help="synthetic training pairs")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps of the train phase")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpus")
    parser.add_argument(
        "--work-dir", type=Path, default=REPO_ROOT / "data" / "bench", help="corpora and caches"
    )
    parser.add_argument(
        "--base",
        type=Path,
        default=DEFAULT_BASE,
        help="Multi30k directory (train/val/test_2016_flickr .de.gz/.en.gz)",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--phase", choices=tuple(PHASES), help=argparse.SUPPRESS)
    return parser.parse_known_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Grow the corpus, then run each phase in its own process and print their figures as one object
    (inside a phase process, ``--phase``: run that phase and print its JSON line)."""
    args, overrides = parse_args(argv)
    work = args.work_dir.resolve()
    corpus_dir, cache_dir = work / f"synthetic-{args.pairs}", work / f"cache-{args.pairs}"
    if args.phase:  # inside a phase process
        cfg = synthetic_config(corpus_dir, cache_dir, work / "run", args.steps, overrides, args.base)
        result = PHASES[args.phase](cfg, args.steps)
        if result:
            print(json.dumps(result))
        return result
    started = time.perf_counter()
    base = args.base.resolve()
    write_synthetic_corpus(base / "train.de.gz", base / "train.en.gz", corpus_dir, args.pairs, seed=args.seed)
    synth_s = time.perf_counter() - started
    shutil.rmtree(cache_dir, ignore_errors=True)  # the first preparation starts from nothing
    result = {
        "pairs": args.pairs,
        "overrides": overrides,
        "synthesis_s": round(synth_s, 1),
        **run_phase("prepare", args, overrides),
        **run_phase("train", args, overrides),
        **run_phase("loader", args, overrides),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
