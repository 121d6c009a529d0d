"""One multilingual model against bilingual models of the same size, per direction, with significance.

    python scripts/report_multilingual.py --multilingual runs/ml6 --bilingual runs/bi_en-de runs/bi_de-en \
        --zero-shot de-fr=runs/ml6/zs.de-fr --out docs/results/ml6_vs_bilingual

Without ``--out`` the Markdown report is printed. See docs/data.md ("Multilingual against bilingual at an
equal total budget") and :mod:`app.reports.multilingual_report`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout without `pip install -e .`

from app.reports.multilingual_report import main

if __name__ == "__main__":
    sys.exit(main())
