"""Train the quickstart model with the recipe that suits this machine (``make demo``).

    python scripts/quickstart.py hydra.run.dir=runs/quickstart       # measure, choose, train
    python scripts/quickstart.py --dry-run                           # the choice and the command only
    python scripts/quickstart.py --recipe quickstart_fp32 hydra.run.dir=runs/qs   # no measuring

A short bf16 and fp32 matrix-product measurement chooses ``experiment=quickstart`` (bf16, where the CPU
has native bf16 that measures well above fp32, or a GPU with native bf16) or ``experiment=quickstart_fp32``;
then ``train.py`` runs with that experiment and any other overrides given here, and its exit status is this
script's. The choice, its reason and the measurements go to ``<run dir>/recipe.json`` first
(library: :mod:`app.training.recipes`).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.training.recipes import (
    RECIPES,
    choose_recipe,
    forced_recipe,
    measure_matmul,
    run_training,
    split_run_dir,
    train_command,
    write_choice,
)

log = logging.getLogger("quickstart")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", choices=RECIPES, help="train this experiment; measure nothing")
    parser.add_argument("--dry-run", action="store_true", help="print the choice and command only")
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. hydra.run.dir=runs/quickstart")
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.INFO, format="quickstart: %(message)s")

    try:
        run_dir, overrides = split_run_dir(args.overrides)  # bad overrides stop before measuring
        choice = forced_recipe(args.recipe) if args.recipe else choose_recipe(measure_matmul())
    except ValueError as err:
        parser.error(str(err))
    log.info("%s", choice.reason)
    command = train_command(choice, overrides, run_dir)
    if args.dry_run:
        print(shlex.join(command))
        return 0
    log.info("wrote %s", write_choice(choice, run_dir))
    log.info("running %s", shlex.join(command))
    return run_training(command)


if __name__ == "__main__":
    sys.exit(main())
