"""The GPU check in one command: issue 48's GPU tests and measurements on a lent GPU, one report.

    bash scripts/gpu_check.sh OUTDIR                          # = make gpu-check OUT=OUTDIR, on the GPU
    bash scripts/gpu_check.sh OUTDIR --only train attention   # some steps again (a kind: all its steps)
    python3 scripts/gpu_check.py OUTDIR --device cpu --tiny   # the same steps at a tiny size on a CPU

Runs the steps of :mod:`app.bench.gpu_plan` one after another, each in its own process group with its
own time box, the whole within ``--budget`` seconds (default 340: under six minutes with the report):
a step that fails or outruns its box is recorded with its last lines and the next one runs; a step that
would start with less time left than it needs is recorded as not run, and the report gives the command
that runs what is missing. After every step the report is written again (atomically) into OUTDIR:
``report.md`` for a person, ``report.json`` with every figure, and ``log.txt`` with each step's command
and the end of its output. Intermediate files go to ``--work`` (a temporary directory by default), so
OUTDIR holds those three files alone (the device tool brings back at most eight).

Needs only ``python3`` with torch: the wheels carried in ``.whl`` (``make gpu-bundle``) are installed into
``--site`` where the project's imports fail, and that directory leads every step's ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.bench.gpu_plan import Outcome, Settings, Step, plan, select
from app.bench.gpu_report import write_report

TAIL_LINES = 15  # of a failed step's output, in the report
LOG_LINES = 200  # of every step's output, in log.txt
DEFAULT_BUDGET_S = 340.0  # + at most 10 s to stop the last step: under six minutes


def step_env(step: Step, settings: Settings) -> dict[str, str]:
    """The environment of a step: the carried wheels' directory and this checkout first on the path
    (tests/ too for the tests' plugin), unbuffered output, and no network for the data libraries."""
    env = dict(os.environ)
    paths = [str(settings.site), str(settings.root)]
    paths += [str(settings.root / "tests")] if step.kind == "tests" else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    env |= {"PYTHONUNBUFFERED": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    return env


def last_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of a log (carriage-return progress bars cut to their last state)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return [line.rsplit("\r", 1)[-1] for line in text.splitlines()[-count:]]


def stop(process: subprocess.Popen[bytes]) -> None:
    """End a step's whole process group: SIGTERM, then SIGKILL after five seconds."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_step(step: Step, settings: Settings, log: Path, timeout: float) -> Outcome:
    """Run one step with its output in ``log``; stopped (its process group) after ``timeout`` seconds."""
    command = shlex.join(step.command)
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as handle:
        handle.write(f"$ {command}\n")
        handle.flush()
        process = subprocess.Popen(
            step.command,
            cwd=settings.root,
            env=step_env(step, settings),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode: int | None = process.wait(timeout=timeout)
            status = "ok" if returncode == 0 else "failed"
            note = "" if returncode == 0 else f"exit status {returncode}"
        except subprocess.TimeoutExpired:
            stop(process)
            returncode, status, note = None, "timed out", f"stopped after its time box of {timeout:.0f} s"
    seconds = round(time.monotonic() - started, 1)
    tail = [] if status == "ok" else last_lines(log, TAIL_LINES)
    return Outcome(step.name, step.kind, status, seconds, returncode, command, note, tail, step.output)


def run_check(
    steps: list[Step], settings: Settings, out: Path, budget_s: float, argv: list[str]
) -> list[Outcome]:
    """Each step in turn within the budget, the report rewritten after each; returns the outcomes."""
    started, outcomes = time.monotonic(), []
    logs = settings.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for step in steps:
        if step.output:  # this run's figures only (a --work directory may hold an earlier run's)
            (settings.work / step.output).unlink(missing_ok=True)
        left = budget_s - (time.monotonic() - started)
        if left < step.min_s:
            note = f"{max(left, 0):.0f} s of the budget left, it needs {step.min_s:.0f} s"
            outcomes.append(
                Outcome(step.name, step.kind, "not run", command=shlex.join(step.command), note=note)
            )
        else:
            print(f"[gpu-check] {step.name} (up to {min(step.box_s, left):.0f} s)", flush=True)
            outcomes.append(
                run_step(step, settings, logs / f"{step.name.replace(':', '_')}.log", min(step.box_s, left))
            )
            print(f"[gpu-check] {step.name}: {outcomes[-1].status} in {outcomes[-1].seconds} s", flush=True)
        write_report(
            out, outcomes, settings, elapsed=time.monotonic() - started, budget_s=budget_s, argv=argv
        )
    return outcomes


def check_kernels(kernels: tuple[str, ...], root: Path) -> None:
    """Refuse a kernel that has no ``conf/attention/<name>.yaml`` (``attention=<name>`` would fail)."""
    valid = sorted(path.stem for path in (root / "conf" / "attention").glob("*.yaml"))
    unknown = [kernel for kernel in kernels if kernel not in valid]
    if unknown:
        raise ValueError(f"unknown kernel(s) {', '.join(unknown)} for --kernels; valid: {', '.join(valid)}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="where report.md, report.json and log.txt go")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--tiny", action="store_true", help="tiny settings on the test corpus (a CPU's check)"
    )
    parser.add_argument(
        "--only", nargs="+", default=None, metavar="STEP", help="these steps (or kinds) alone"
    )
    parser.add_argument(
        "--kernels", nargs="+", default=None, help="training rows' kernels (default: detected)"
    )
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all the steps")
    parser.add_argument(
        "--work", type=Path, default=None, help="intermediate files (default: a temporary dir)"
    )
    parser.add_argument("--site", type=Path, default=Path("/tmp/gpu-check-site"), help="where wheels install")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs the steps")
    parser.add_argument("--list", action="store_true", help="print the steps and their commands, run nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the check; exit status 0 when every chosen step ran and passed, 1 otherwise, 2 on bad options."""
    args = parse_args(argv)
    if args.budget <= 0:
        print(f"error: --budget must be > 0 seconds, got {args.budget}", file=sys.stderr)
        return 2
    if args.list:
        work = args.work or Path(tempfile.gettempdir()) / "gpu-check-WORK"
    else:
        work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    settings = Settings(
        device=args.device,
        tiny=args.tiny,
        work=work.resolve(),
        python=args.python,
        site=args.site,
        kernels=tuple(args.kernels or ()),
    )
    try:
        check_kernels(settings.kernels, settings.root)
        steps = select(plan(settings), args.only)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.list:
        for step in steps:
            print(f"{step.name} (box {step.box_s:.0f} s): {shlex.join(step.command)}")
        return 0
    outcomes = run_check(steps, settings, args.out, args.budget, sys.argv[1:] if argv is None else argv)
    print(f"[gpu-check] report: {args.out / 'report.md'}")
    return 0 if all(o.status == "ok" for o in outcomes) else 1
