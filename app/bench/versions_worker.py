"""One measuring process of :mod:`app.bench.versions`: times the torch engine of whichever tree ``app`` was
imported from (the orchestrator copies this file into the baseline's tree) and CTranslate2 float32.

Uses only what every version since the CTranslate2 engine has: a torch engine's loader (``load_torch_engine``
in ``app.inference.torch_engine``, ``load_translator`` in ``app.inference.translator`` before 2026-11-28),
``SearchSettings``, ``CT2Engine``; a compile mode other than "off" is passed to versions whose loader takes
one.
Prints one JSON object: seconds per case, each case's outputs, and the warm-up's seconds (with compiled
decoding steps, the compile time: every case runs once untimed first, so no graph compiles while timed).
"""

from __future__ import annotations

import gzip
import inspect
import json
import sys
import time
from pathlib import Path

import torch

CASES = (("greedy", 1, 64), ("beam5", 5, 64), ("latency", 1, 1))  # (name, beam, batch)


def read_lines(path: str, limit: int) -> list[str]:
    raw = Path(path).read_bytes()
    text = gzip.decompress(raw) if path.endswith(".gz") else raw
    return text.decode("utf-8").splitlines()[:limit]


def warm_up(engine, sentences: list[str], max_len: int) -> float:
    """Seconds of one untimed run of every case on a few sentences (the shapes the timed runs meet)."""
    from app.inference.engine import SearchSettings

    started = time.perf_counter()
    for beam in (1, 5):
        engine.translate(sentences[:4], SearchSettings(beam=beam))
    for _, beam, batch in CASES:
        settings = SearchSettings(beam=beam, batch_size=batch, max_len=max_len)
        groups = [[line] for line in sentences[:2]] if batch == 1 else [sentences[:16]]
        for group in groups:
            engine.translate(group, settings)
    return time.perf_counter() - started


def time_engine(engine, sentences: list[str], latency_lines: int, max_len: int) -> dict[str, dict]:
    """Seconds and outputs of every case, after an untimed warm-up (:func:`warm_up`)."""
    from app.inference.engine import SearchSettings

    found: dict[str, dict] = {"warmup": {"seconds": warm_up(engine, sentences, max_len), "outputs": []}}
    for name, beam, batch in CASES:
        settings = SearchSettings(beam=beam, batch_size=batch, max_len=max_len)
        started = time.perf_counter()
        if batch == 1:
            outputs = [engine.translate([line], settings)[0] for line in sentences[:latency_lines]]
        else:
            outputs = engine.translate(sentences, settings)
        found[name] = {"seconds": time.perf_counter() - started, "outputs": outputs}
    return found


def main(argv: list[str]) -> int:
    """argv: checkpoint, source file, sentence limit, latency lines, most output tokens, CTranslate2 export
    folder or '-', and optionally the torch engine's compile mode (default off)."""
    try:
        from app.inference.ct2_engine import CT2Engine
        from app.inference.torch_engine import load_torch_engine
    except ImportError:  # a version before the engines' modules were named for them
        from app.inference.engines import CT2Engine
        from app.inference.translator import load_translator as load_torch_engine

    checkpoint, source, limit, latency_lines, max_len, ct2_dir, *rest = argv
    compile_mode = rest[0] if rest else "off"
    torch.set_num_threads(1)
    sentences = read_lines(source, int(limit))
    options = {}
    if compile_mode != "off" and "compile" in inspect.signature(load_torch_engine).parameters:
        options["compile"] = compile_mode
    translator, _ = load_torch_engine(checkpoint, device="cpu", **options)
    result = {"torch-fp32": time_engine(translator, sentences, int(latency_lines), int(max_len))}
    report = getattr(translator, "compile_report", lambda: None)()
    result["compile"] = {"mode": options.get("compile", "off"), "report": report}
    if ct2_dir != "-":
        result["ct2-fp32"] = time_engine(
            CT2Engine(ct2_dir, threads=1), sentences, int(latency_lines), int(max_len)
        )
    import app

    result["app"] = str(Path(app.__file__).parent)  # which tree was measured
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
