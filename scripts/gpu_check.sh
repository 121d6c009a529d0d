#!/usr/bin/env bash
# The GPU check in one command, for whoever holds a GPU for a few minutes (issue 48): the GPU tests, the
# training and attention benchmark rows, compile's warm-up, a short training; one report in OUTDIR
# (report.md, report.json, log.txt) in under six minutes. Runs with the machine's python3 (torch there);
# the wheels of `make gpu-bundle`, carried in .whl/, are installed where the project's imports fail.
#   bash scripts/gpu_check.sh OUTDIR [--only STEP...] [--budget SECONDS]   (python3 scripts/gpu_check.py -h)
set -u
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: bash scripts/gpu_check.sh OUTDIR [options of scripts/gpu_check.py]" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
