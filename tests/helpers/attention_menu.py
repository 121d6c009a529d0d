"""One small attention configuration per kernel (and head layout), for the tests that must hold for every
kernel a model can decode with: the compiled decoding steps, beam search's shared cross-attention keys.

Each entry is an ``attention`` mapping as the model builders take it. The sizes are tiny (a chunk of 1, a
projection to 4 rows) so that every code path of a kernel runs on 3-11 token inputs.
"""

from __future__ import annotations

from typing import Any

EAGER_CROSS = {"cross": {"kernel": "eager"}}  # for kernels that cannot serve cross-attention

ATTENTION: dict[str, dict[str, Any]] = {
    "eager": {"kernel": "eager"},
    "eager_gqa": {"kernel": "eager", "num_kv_heads": 2},
    "sdpa_gqa": {"kernel": "sdpa", "num_kv_heads": 2},
    "sdpa_mqa": {"kernel": "sdpa", "num_kv_heads": 1},
    "flash": {"kernel": "flash", "options": {"backend": "math"}},
    "sparse": {
        "kernel": "sparse",
        "options": {"pattern": "sliding_window", "window": 2},
        "sites": EAGER_CROSS,
    },
    "flex": {"kernel": "flex"},
    "sparse_flex": {  # the sliding window as FlexAttention block sparsity
        "kernel": "sparse",
        "options": {"pattern": "sliding_window", "window": 2, "backend": "flex"},
        "sites": EAGER_CROSS,
    },
    "linformer": {"kernel": "eager", "sites": {"cross": {"kernel": "linformer", "options": {"k": 4}}}},
    "linear": {"kernel": "linear", "options": {"feature_map": "favor", "num_features": 16}},
    "lsh": {
        "kernel": "lsh",
        "options": {"chunk_size": 1, "n_buckets": 2, "n_hashes": 2},
        "sites": EAGER_CROSS,
    },
    "lsh_shared_qk": {  # the paper's form, conf/attention/lsh.yaml's default: keys are the queries
        "kernel": "lsh",
        "options": {"chunk_size": 1, "n_buckets": 2, "n_hashes": 2, "shared_qk": True},
        "sites": EAGER_CROSS,
    },
}


def attention_menu(*names: str) -> dict[str, dict[str, Any]]:
    """The named entries of :data:`ATTENTION`, in the order given."""
    return {name: ATTENTION[name] for name in names}
