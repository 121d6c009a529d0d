"""Model configs small enough for tests that run a whole pipeline (server, benchmark) in seconds."""

from __future__ import annotations

from typing import Any

TINY_TRANSFORMER: dict[str, Any] = {
    "family": "transformer",
    "d_model": 32,
    "num_heads": 4,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "d_ff": 64,
    "dropout": 0.0,
    "share_src_tgt_embeddings": True,
    "max_positions": 32,
}
