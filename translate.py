"""Translate with a trained checkpoint: ``python translate.py CKPT "Ein Mann fährt Fahrrad."``.

Without sentences it reads standard input (or ``-i FILE``) and writes one line per input line.
Exit status: 0 done, 2 a bad argument, model, input or output, 130 interrupted (Ctrl-C).
"""

import sys

try:
    from app.inference.cli import main
except KeyboardInterrupt:  # Ctrl-C while torch loads: as quiet as one later (main returns 130)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
