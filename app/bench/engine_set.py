"""The engines the decoding benchmark compares (:mod:`app.bench.engines`), built from one model.

Engine kinds: our PyTorch model in float32 and under bfloat16 autocast, and its CTranslate2 export in
float32 and int8. :func:`engine_set` builds one engine per (kind, threads) from a torch engine and a way
to export it; :func:`open_engines` does so for a checkpoint as it was trained, and
:mod:`app.bench.engine_kernels` for its model rebuilt with other attention kernels.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from app.export.ct2 import export_ct2
from app.inference.ct2_engine import CT2Engine
from app.inference.engine import Engine, SearchSettings, Translation, Truncated
from app.inference.engines import open_engine

ENGINE_KINDS = ("torch-fp32", "torch-bf16", "ct2-fp32", "ct2-int8")
CT2_QUANTIZATION = {"ct2-fp32": "float32", "ct2-int8": "int8"}
EngineKey = tuple[str | None, str, int]
"""(attention kernel, engine kind, threads); the kernel is None for a checkpoint decoded as trained
without ``--kernels``."""


class AutocastEngine(Engine):
    """A torch engine run under bfloat16 autocast: matrix products in bf16, softmax, norms and the
    search's log-probabilities stay float32 (``model.to(bfloat16)`` would round those too)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.name = "torch-bf16"
        self.source = inner.source
        self.max_source_tokens = inner.max_source_tokens
        self.tgt_tokenizer = inner.tgt_tokenizer

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Truncated | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        device = self.inner.device.type
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            return self.inner.translate_nbest(sentences, settings, on_truncate, details=details)


def check_kinds(kinds: list[str]) -> None:
    unknown = sorted(set(kinds) - set(ENGINE_KINDS))
    if unknown:
        raise ValueError(f"unknown engine {', '.join(unknown)}; choose from {', '.join(ENGINE_KINDS)}")


def engine_set(
    torch_engine: Engine, export: Callable[[str], Path], kinds: list[str], threads: list[int]
) -> dict[tuple[str, int], Engine]:
    """An engine per (kind, threads): ``torch_engine`` itself, under autocast, or a CTranslate2 engine
    on ``export(kind)`` (an export directory, written once per kind).

    Torch engines are shared across thread counts (the benchmark sets torch's pool before each run);
    CTranslate2 fixes its threads when loading, so it gets one translator per thread count."""
    engines: dict[tuple[str, int], Engine] = {}
    for kind in kinds:
        exported = export(kind) if kind in CT2_QUANTIZATION else None
        for count in threads:
            if kind == "torch-fp32":
                engines[kind, count] = torch_engine
            elif kind == "torch-bf16":
                engines[kind, count] = AutocastEngine(torch_engine)
            else:
                engines[kind, count] = CT2Engine(exported, threads=count)
    return engines


@contextmanager
def open_engines(
    checkpoint: str | Path, kinds: list[str], threads: list[int], *, compile: str = "off"
) -> Iterator[dict[EngineKey, Engine]]:
    """An engine per (kind, threads) for ``checkpoint`` as trained (kernel None), the torch ones with their
    decoding steps compiled per ``compile``; CTranslate2 exports live in a temporary directory meanwhile.
    Each engine's ``tgt_tokenizer`` counts its output subwords."""
    check_kinds(kinds)
    torch_engine = open_engine(checkpoint, engine="torch", compile=compile)
    with tempfile.TemporaryDirectory(prefix="bench_decoding_") as tmp:

        def export(kind: str) -> Path:
            return export_ct2(checkpoint, Path(tmp) / kind, quantization=CT2_QUANTIZATION[kind])

        engines = engine_set(torch_engine, export, kinds, threads)
        yield {(None, kind, count): engine for (kind, count), engine in engines.items()}
