#!/usr/bin/env bash
# Score one eole checkpoint of a finished ../shared/peers/run_eole.sh run, the way run_eole.sh scores its
# final one (greedy and beam 5 on test_2016_flickr, sacreBLEU, summary.json), for when run_eole.sh found
# none inside the budget: eole trains on for up to 180 s after its SIGINT and, with keep_checkpoint 3,
# may have rotated the in-budget checkpoints away (run_eole.sh then moved the later ones aside).
#
#   bash scripts/eval_eole_checkpoint.sh /tmp/eole-peer-compare 825
#   python scripts/compare_with_eole.py --work /tmp/eole-peer-compare --reuse-eole    # then our side
set -euo pipefail
WORK=$1; STEP=$2
PEERS=${PEERS:-$(cd "$(dirname "$0")/../../shared/peers" && pwd)}
VENV=${VENV:-/tmp/venv-eole}
RUN=runs/eole_transformer
cd "$WORK"
if [ -d "$RUN/step_${STEP}_after_budget_unused" ]; then
  mv "$RUN/step_${STEP}_after_budget_unused" "$RUN/model/step_$STEP"
fi
ckpt=$RUN/model/step_$STEP
[ -d "$ckpt" ] || { echo "no checkpoint $WORK/$ckpt" >&2; exit 1; }
"$VENV/bin/python" "$PEERS/eole_fix_ckpt_config.py" "$ckpt"
for beam in 1 5; do
  out=$RUN/test_$([ "$beam" = 1 ] && echo greedy || echo beam5)
  /usr/bin/time -v "$VENV/bin/eole" predict -model_path "$ckpt" -src data/test_2016_flickr.de \
      -output "$out.hyp" -beam_size "$beam" -batch_size 64 -batch_type sents -max_length 100 \
      -length_penalty wu -alpha 1.0 -report_time > "$out.stdout" 2> "$out.log"
  "$VENV/bin/sacrebleu" data/test_2016_flickr.en -i "$out.hyp" -m bleu chrf -w 2 > "$out.sacrebleu.json"
done
"$VENV/bin/python" "$PEERS/summarize_eole.py" "$RUN" runs/logs/eole_transformer_train
