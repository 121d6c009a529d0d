"""The menu of engines, and opening one from what a user names (a checkpoint or an export).

The torch engine is :class:`~app.inference.torch_engine.TorchEngine`, the CTranslate2 one
:class:`~app.inference.ct2_engine.CT2Engine`; both implement :class:`~app.inference.engine.Engine`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from app.data.multilingual import Languages
from app.export.ct2 import is_ct2_model_dir
from app.hardware import usable_device
from app.inference.ct2_engine import CT2Engine
from app.inference.engine import (
    Engine,
)
from app.inference.languages import with_languages
from app.inference.torch_engine import load_torch_engine

ENGINES = ("torch", "ct2")


def choose_engine(path: str | os.PathLike[str], engine: str | None) -> str:
    """The engine for ``path``: as asked, else ``ct2`` for an exported directory and ``torch`` otherwise."""
    if engine is None:
        return "ct2" if is_ct2_model_dir(path) else "torch"
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    return engine


def open_engine(
    path: str | os.PathLike[str],
    *,
    engine: str | None = None,
    device: str = "cpu",
    threads: int = 0,
    ensemble: list[str] | None = None,
    sources_tagged: bool = False,
    compile: str = "off",
) -> Engine:
    """Load ``path`` (a checkpoint, or a CTranslate2 directory) into the chosen engine.

    ``device`` must be usable here by the chosen engine (a ValueError names it otherwise).
    ``threads`` > 0 sets the CPU threads once, here (torch's intra-op pool, CTranslate2's intra_threads).
    ``ensemble`` checkpoints decode together with ``path`` (torch engine; see :class:`Ensemble`).
    ``compile`` (auto | aot | off): the torch engine's decoding through AOTInductor packages
    (:mod:`app.acceleration.auto`; CTranslate2 ignores it).
    A multilingual model's engine takes ``settings.target_lang`` and tags the sources itself, unless
    ``sources_tagged`` (see :func:`~app.inference.languages.with_languages`); ``engine.languages`` says
    which directions it was trained on.
    """
    chosen = choose_engine(path, engine)
    if ensemble and chosen != "torch":
        raise ValueError(f"--ensemble needs the torch engine and .ckpt checkpoints, got {path} ({chosen})")
    if chosen == "ct2":
        if not is_ct2_model_dir(path):
            raise ValueError(
                f"--engine ct2 needs a directory written by scripts/export.py --format ct2, got {path}"
            )
        check_ct2_device(device)
        ct2 = CT2Engine(path, device=device, threads=threads)
        return with_languages(ct2, ct2.languages, sources_tagged=sources_tagged)
    if Path(path).is_dir():
        raise ValueError(f"--engine torch needs a .ckpt checkpoint, got the directory {path}")
    usable_device(device)  # an unusable device is named before any model is read
    if threads > 0:
        torch.set_num_threads(threads)
    translator, config = load_torch_engine(path, device=device, ensemble=ensemble or (), compile=compile)
    return with_languages(translator, Languages.from_config(config), sources_tagged=sources_tagged)


def check_ct2_device(device: str) -> None:
    """CTranslate2's devices (``cpu``, ``cuda``, ``auto``), ``cuda`` only where it sees a GPU: its own
    error comes from deep inside the library. (Its CUDA is its own: a CPU-only torch does not matter.)"""
    import ctranslate2  # an optional dependency (the ``serve`` extra), as in CT2Engine

    if device not in ("cpu", "cuda", "auto"):
        raise ValueError(f"device {device!r} is not one of CTranslate2's: cpu, cuda, auto")
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise ValueError(f"device {device!r} is not available: CTranslate2 sees no CUDA GPU; use cpu")
