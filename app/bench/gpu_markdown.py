"""The GPU check's report as a page for a person (report.md) and its steps' logs (log.txt), from the
object :func:`app.bench.gpu_report.assemble` builds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.bench.gpu_plan import Outcome

LOG_LINES = 200  # of each step's output in log.txt


def _num(value: Any, digits: int = 0, scale: float = 1.0) -> str:
    """A figure for a table cell: thousands separated, '' where absent."""
    if value is None or value == "":
        return ""
    return f"{float(value) * scale:,.{digits}f}"


def environment_lines(env: dict[str, Any], check: dict[str, Any]) -> list[str]:
    """The heading and the machine: GPU, driver, torch/CUDA, Python, CPUs, the versions that matter."""
    gpu = env.get("gpu") or "no GPU"
    title = f"# GPU check: {gpu}, torch {env.get('torch', '?')} (CUDA {env.get('cuda') or 'none'})"
    packages = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v and k != "torch")
    machine = gpu
    if env.get("gpu"):
        machine += (
            f" ({_num(env['gpu_memory_mib'])} MiB, capability {env['capability']}, driver {env['driver']})"
        )
        machine += f", cuDNN {env['cudnn']}"
    machine += f", Python {env.get('python')}, {env.get('cpu_count')} CPUs ({env.get('cpu_model')})"
    took = f"{check['seconds']:.0f} s of a {check['budget_s']:.0f} s budget"
    size = " (tiny settings)" if check["tiny"] else ""
    return [
        title,
        "",
        f"- **Machine.** {machine}." if env else "- **Machine.** not read (env step).",
        f"- **Versions.** {packages}." if packages else "",
        f"- **Run.** {took}, device {check['device']}{size}; `{' '.join(check['argv'])}`.",
        "",
    ]


def steps_lines(steps: list[dict[str, Any]]) -> list[str]:
    """The steps' table, then each failed or stopped step's last lines."""
    lines = ["## Steps", "", "| step | status | seconds | note |", "|---|---|---|---|"]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['note']} |" for s in steps]
    for step in steps:
        if step["tail"]:
            lines += ["", f"### {step['name']}: {step['status']} ({step['note']})", "", "```"]
            lines += [*step["tail"], "```"]
    return [*lines, ""]


def bench_table(rows: list[dict[str, Any]], title: str, commands: list[str]) -> list[str]:
    """A table of bench_train.py rows under the commands that measured them: the choices that vary,
    then the figures."""
    if not rows:
        return []
    choices = [k for k in ("attention", "layout", "max_tokens", "concat") if any(k in r for r in rows)]
    head = [
        *choices,
        "tokens/s",
        "x eager",
        "target tokens/s",
        "achieved TFLOP/s",
        "MFU %",
        "peak GPU MB",
        "warm-up s",
    ]
    lines = [
        f"## {title}",
        "",
        "```",
        *commands,
        "```",
        "",
        f"| {' | '.join(head)} |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [str(r.get(k, "")) for k in choices]
        if "error" in r:
            cells += [r["error"][:120], *[""] * (len(head) - len(choices) - 1)]
        else:
            cells += [
                _num(r.get("tokens_per_s")),
                _num(r.get("x_eager"), 2),
                _num(r.get("target_tokens_per_s")),
                _num(r.get("model_tflops"), 1 if (r.get("model_tflops") or 0) >= 1 else 4),
                _num(r.get("mfu"), 1, 100),
                _num(r.get("peak_cuda_mb")),
                _num(r.get("warmup_s"), 1),
            ]
        lines.append(f"| {' | '.join(cells)} |")
    return [*lines, ""]


def attention_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The attention benchmark's rows: time, as a multiple of sdpa's, and peak memory."""
    if not rows:
        return []
    lines = [
        "## One attention layer, forward + backward (scripts/bench_attention.py)",
        "",
        "| case | length | ms | x sdpa's time | peak MiB | status |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = _num(int(r["peak_bytes"]) / 2**20, 1) if str(r["peak_bytes"]).isdigit() else r["peak_bytes"]
        lines.append(
            f"| {r['variant']} | {r['length']} | {_num(r['time_ms'], 2)} | {_num(r.get('x_sdpa_time'), 2)} "
            f"| {peak} | {r['status']} |"
        )
    return [*lines, ""]


def other_lines(report: dict[str, Any]) -> list[str]:
    """The tests' counts, the short training, and what to run again."""
    lines = []
    tests = report["tests"]
    if tests:
        lines += [
            "## GPU tests",
            "",
            f"{tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped.",
        ]
        lines += [f"- `{f['test']}`: {f['message']}" for f in tests["failures"]] + [""]
    if report["short_train"]:
        st = report["short_train"]
        lines += [
            "## Short training (experiment=quickstart)",
            "",
            ", ".join(f"{k} {v}" for k, v in st.items()),
            "",
        ]
    if report["rerun"]:
        lines += [
            "## Not finished",
            "",
            "What failed, stopped or did not run, again:",
            "",
            f"`{report['rerun']}`",
            "",
        ]
    return lines


def commands(report: dict[str, Any], kind: str) -> list[str]:
    """The commands of a kind's steps, from the script on (the interpreter's path left out)."""
    return [s["command"].split(" ", 1)[-1] for s in report["steps"] if s["kind"] == kind and s["command"]]


def markdown(report: dict[str, Any]) -> str:
    """The whole page."""
    kind = "tiny, CPU" if report["check"]["tiny"] else "one GPU, bf16"
    compiled = "compile_model=true (x eager: against eager mode's row)"
    lines = [
        *environment_lines(report["environment"], report["check"]),
        *steps_lines(report["steps"]),
        *bench_table(report["train"], f"Training rows ({kind})", commands(report, "train")),
        *bench_table(report["compile"], compiled, commands(report, "compile")),
        *attention_lines(report["attention"]),
        *bench_table(report["length"], "Length benchmark row", commands(report, "length")),
        *other_lines(report),
    ]
    return "\n".join(line for i, line in enumerate(lines) if line or (i and lines[i - 1])) + "\n"


def log_text(logs: Path, outcomes: list[Outcome]) -> str:
    """Each step's command and the last lines of its output, in order."""
    parts = []
    for outcome in outcomes:
        log = logs / f"{outcome.name.replace(':', '_')}.log"
        text = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
        cut = [line.rsplit("\r", 1)[-1] for line in text[-LOG_LINES:]]
        head = f"===== {outcome.name}: {outcome.status} {outcome.note}".rstrip()
        parts.append("\n".join([head, *(cut or [f"$ {outcome.command}"])]))
    return "\n\n".join(parts) + "\n"
