#!/usr/bin/env bash
# Attention ablation at an equal wall-clock budget: the quickstart Transformer (de->en) trained once per
# attention variant, one after another, then tabulated.
#
#   bash scripts/ablate_attention.sh                  # 8 minutes each, runs/ablation_8min/<variant>
#   BUDGET=00:00:05:00 OUT=runs/ablation_5min bash scripts/ablate_attention.sh
#
# Variants: mha (eager), gqa (2 kv heads), mqa, linear (elu+1), flash (SDPA backend auto) and sparse
# (sliding window 8: Multi30k sentences average 15 subwords, so the default window of 16 is nearly dense).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BUDGET=${BUDGET:-00:00:08:00}
OUT=${OUT:-runs/ablation_8min}
common=(experiment=quickstart "trainer.max_time=$BUDGET" trainer.enable_progress_bar=false)
"$PY" train.py -m "${common[@]}" attention=mha,gqa,mqa,linear,flash \
    "hydra.sweep.dir=$OUT" 'hydra.sweep.subdir=${hydra.runtime.choices.attention}'
"$PY" train.py "${common[@]}" attention=sparse attention.window=8 "hydra.run.dir=$OUT/sparse_w8"
"$PY" scripts/summarize_runs.py "$OUT"/*/ | tee "$OUT/summary.md"
