"""Equal-budget, same-session comparison with the eole peer: train eole, then this project, then tabulate.

    python scripts/compare_with_eole.py                          # 25 minutes each, runs/peer_eole_25min
    python scripts/compare_with_eole.py --budget-s 600 --out runs/peer_eole_10min

Both train the same-size Transformer (3+3 layers, d_model 256, 4 heads, FFN 1024, joint 8k
sentencepiece) on Multi30k de->en for the same wall-clock budget, one after the other (never at the
same time: the 2 CPU cores would be shared), then decode test_2016_flickr with beam 5. eole is run
through ``../shared/peers/run_eole.sh`` (which installs it in its own virtual environment); this project
through ``train.py experiment=multi30k_transformer``. Writes ``<out>/comparison.md`` and
``<out>/comparison.json`` with BLEU (cased and lowercased), chrF, training tokens/s and their ratios.
When run_eole.sh finds no checkpoint inside the budget, score one with ``scripts/eval_eole_checkpoint.sh``
and rerun with ``--reuse-eole``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.reports.eole import (  # noqa: E402
    comparison_rows,
    eole_comparison_markdown,
    read_eole,
    run_eole,
    run_ours,
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget-s", type=int, default=1500, help="training wall-clock budget, seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "peer_eole_25min")
    parser.add_argument("--peers", type=Path, default=ROOT.parent / "shared" / "peers")
    parser.add_argument("--work", type=Path, default=Path("/tmp/eole-peer-compare"), help="eole's folder")
    parser.add_argument(
        "--reuse-eole",
        action="store_true",
        help="do not train eole: read the finished run in --work (e.g. after evaluating it by hand)",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for this project's run")
    args = parser.parse_args()
    if not (args.peers / "run_eole.sh").is_file():
        parser.error(f"no run_eole.sh in --peers {args.peers}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reuse_eole:
        eole = read_eole(args.work)
    else:
        shutil.rmtree(args.work / "runs" / "eole_transformer", ignore_errors=True)  # a fresh eole run
        eole = run_eole(args.peers, args.work, args.budget_s, args.out / "eole.log")
    (args.out / "eole_summary.json").write_text(json.dumps(eole, indent=1))
    ours = run_ours(args.out.resolve() / "ours", args.budget_s, args.out / "ours.log", args.overrides)

    rows = comparison_rows(eole, ours)
    (args.out / "comparison.json").write_text(json.dumps(rows, indent=1))
    table = eole_comparison_markdown(rows, args.budget_s)
    (args.out / "comparison.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
