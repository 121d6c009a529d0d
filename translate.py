"""Translate with a trained checkpoint: ``python translate.py CKPT "Ein Mann fährt Fahrrad."``.

Without sentences it reads standard input (or ``-i FILE``) and writes one line per input line.
"""

import sys

from app.inference.cli import main

if __name__ == "__main__":
    sys.exit(main())
