"""One measuring process of :mod:`app.bench.versions`: times the torch engine of whichever tree ``app`` was
imported from (the orchestrator copies this file into the baseline's tree) and CTranslate2 float32.

Uses only what every version since the CTranslate2 engine has: ``load_translator``, ``SearchSettings``,
``CT2Engine``. Prints one JSON object: seconds per case and each case's outputs.
"""

from __future__ import annotations

import gzip
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


def time_engine(engine, sentences: list[str], latency_lines: int, max_len: int) -> dict[str, dict]:
    """Seconds and outputs of every case, after one untimed warm-up call per beam."""
    from app.inference.engine import SearchSettings

    for beam in (1, 5):
        engine.translate(sentences[:4], SearchSettings(beam=beam))
    found = {}
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
    folder or '-'."""
    from app.inference.engines import CT2Engine
    from app.inference.translator import load_translator

    checkpoint, source, limit, latency_lines, max_len, ct2_dir = argv
    torch.set_num_threads(1)
    sentences = read_lines(source, int(limit))
    translator, _ = load_translator(checkpoint, device="cpu")
    result = {"torch-fp32": time_engine(translator, sentences, int(latency_lines), int(max_len))}
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
