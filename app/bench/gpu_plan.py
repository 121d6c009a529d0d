"""The GPU check's steps (:mod:`app.bench.gpu_check` runs them): each a command, its time box, and the
file it leaves for the report.

In order, so that what matters most runs first when the time runs short: the machine and versions
(``env``), the carried wheels where imports fail (``install``), the GPU tests (every test whose skip
marker asks for CUDA or a GPU, found here by reading the test files), the attention benchmark at 16,384
tokens, issue 48's training benchmark rows (one process per attention kernel:
``experiment=multi30k_transformer model=transformer``, bf16, batches of 16,384 and 65,536 tokens, in
each layout the data config offers), ``compile_model=true`` with its warm-up, a short training that ends
with test BLEU, and a row of the length benchmark (K=256). Kernels and layouts are read from the
checkout: ``attention=flex`` runs where ``conf/attention/flex.yaml`` exists, ``data.layout=packed`` where
the data config has a ``layout`` key, the attention benchmark's flex cases where
``app/bench/attention_cases.py`` lists them.

``--tiny`` (with ``--device cpu``) builds the same steps at a tiny size on the test corpus
(tests/fixtures/multi30k): what the tests run. Nothing here imports more than the standard library, so
the plan is made before the carried wheels are installed.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_KERNELS = ("eager", "sdpa", "flash")  # the table
OPTIONAL_KERNELS = ("flex",)  # measured where the checkout has them
ATTENTION_CASES = ("eager", "sdpa", "sparse_window256")  # the one-layer row at 16,384 tokens
CHECK_TESTS = ("slow or not slow",)
# What the carried wheels provide (app/bench/gpu_bundle.py's BUNDLE): the install step looks for these
# modules, installs the wheels where one is missing, then imports them all.
CHECK_IMPORTS = ("hydra", "omegaconf", "datasets", "sacremoses")


@dataclass(frozen=True)
class Step:
    """One command of the check. ``box_s`` bounds its time; it is not started with less than ``min_s``
    left of the whole check's budget. ``output`` (in the work directory) is what the report reads."""

    name: str
    kind: str  # env | install | tests | train | attention | compile | short-train | length
    command: list[str]
    box_s: float
    min_s: float
    output: str | None = None


@dataclass
class Outcome:
    """What became of one step: ok | failed | timed out | not run, with its time and last lines."""

    name: str
    kind: str
    status: str
    seconds: float = 0.0
    returncode: int | None = None
    command: str = ""
    note: str = ""
    tail: list[str] = field(default_factory=list)
    output: str | None = None  # the file in the work directory its figures are read from


@dataclass(frozen=True)
class Settings:
    """What the plan depends on: the device, the size, where files go, and what the checkout offers."""

    device: str  # cuda | cpu
    tiny: bool
    work: Path
    python: str = "python3"
    wheels: Path = REPO_ROOT / ".whl"
    site: Path = Path("/tmp/gpu-check-site")
    kernels: tuple[str, ...] = ()  # empty: BASE_KERNELS and the optional ones the checkout has
    layouts: tuple[str, ...] = ()  # empty: as the data config offers
    root: Path = REPO_ROOT
    imports: tuple[str, ...] = CHECK_IMPORTS  # what the install step checks


def gpu_test_files(root: Path = REPO_ROOT) -> list[Path]:
    """Test files with a ``skipif`` marker whose condition asks for CUDA (the GPU tests and the CUDA unit
    tests); which of their tests run is chosen by the pytest plugin ``helpers.gpu_tests``."""
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if "skipif" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            call = isinstance(node, ast.Call) and ast.unparse(node.func).endswith("skipif")
            if call and node.args and "cuda" in ast.unparse(node.args[0]).lower():
                found.append(path)
                break
    return found


def detected_kernels(root: Path = REPO_ROOT) -> tuple[str, ...]:
    """The issue's kernels, then each optional one whose config exists (``attention=<name>``)."""
    extra = tuple(k for k in OPTIONAL_KERNELS if (root / "conf" / "attention" / f"{k}.yaml").is_file())
    return BASE_KERNELS + extra


def detected_layouts(root: Path = REPO_ROOT) -> tuple[str, ...]:
    """``("padded", "packed")`` where the data config has a ``layout`` key, else ``()`` (one layout)."""
    text = (root / "conf" / "data" / "multi30k.yaml").read_text(encoding="utf-8")
    return ("padded", "packed") if re.search(r"^layout:", text, re.MULTILINE) else ()


def attention_cases(root: Path = REPO_ROOT) -> list[str]:
    """The attention benchmark's cases to run: the issue's three, then every case of a flex kernel that
    ``app/bench/attention_cases.py`` lists (read, not imported: torch is not needed to plan)."""
    tree = ast.parse((root / "app" / "bench" / "attention_cases.py").read_text(encoding="utf-8"))
    flex = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "KernelCase":
            given = dict(zip(("name", "kernel"), node.args, strict=False))
            given |= {k.arg: k.value for k in node.keywords if k.arg in ("name", "kernel")}
            values = [v.value for v in given.values() if isinstance(v, ast.Constant)]
            if (
                "name" in given
                and isinstance(given["name"], ast.Constant)
                and "flex" in " ".join(map(str, values))
            ):
                flex.append(given["name"].value)
    return [*ATTENTION_CASES, *dict.fromkeys(flex)]


def tiny_overrides(s: Settings) -> list[str]:
    """A 1+1-layer, width-32 model on the test corpus, fp32 on the CPU: every step's tiny settings."""
    return [
        f"data.dir={s.root / 'tests' / 'fixtures' / 'multi30k'}",
        "data.suffix=.gz",
        "data.fetch=null",
        f"data.cache_dir={s.work / 'cache'}",
        "data.subword.vocab_size=500",
        "model.d_model=32",
        "model.num_heads=4",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
        "model.d_ff=64",
        "trainer.accelerator=cpu",
        "trainer.precision=32-true",
    ]


def device_overrides(s: Settings) -> list[str]:
    """The device and precision every training step shares: one GPU in bf16, or the tiny CPU settings."""
    return tiny_overrides(s) if s.tiny else ["trainer.accelerator=gpu", "trainer.devices=1"]


def bench_windows(s: Settings, warmup: int = 5) -> list[str]:
    """bench_train.py's step windows: few, since the whole check has six minutes."""
    if s.tiny:
        return ["--warmup-steps", "1", "--windows", "2", "--window-steps", "1", "--peak-size", "256"]
    return ["--warmup-steps", str(warmup), "--windows", "3", "--window-steps", "8"]


def train_step(s: Settings, kernel: str, *, first: bool) -> Step:
    """Issue 48's training rows of one kernel: both batch sizes, each layout (padded rows first); the
    first kernel's step also prepares the data (sentencepiece, the Arrow cache), hence its longer box."""
    layouts = s.layouts or detected_layouts(s.root)
    sizes = "800,1600" if s.tiny else "16384,65536"
    precision = [] if s.tiny else ["trainer.precision=bf16-mixed"]
    command = [s.python, "scripts/bench_train.py", "experiment=multi30k_transformer", "model=transformer"]
    command += [*device_overrides(s), *precision, f"attention={kernel}"]
    command += [f"data.layout={','.join(layouts)}"] if layouts else []
    output = f"train_{kernel}.jsonl"
    command += [f"data.max_tokens={sizes}", *bench_windows(s), "--keep-going", "--out", str(s.work / output)]
    box = 60 + 15 * len(layouts) + (40 if first else 0)
    return Step(f"train:{kernel}", "train", command, box_s=box, min_s=20, output=output)


def compile_step(s: Settings) -> Step:
    """``compile_model=true`` at 16,384 tokens, eager attention: its warm-up (``warmup_s``) and speed."""
    command = [s.python, "scripts/bench_train.py", "experiment=multi30k_transformer", "model=transformer"]
    command += [*device_overrides(s), *([] if s.tiny else ["trainer.precision=bf16-mixed"])]
    command += ["attention=eager", f"data.max_tokens={800 if s.tiny else 16384}", "compile_model=true"]
    command += [*bench_windows(s, warmup=10), "--keep-going", "--out", str(s.work / "compile.jsonl")]
    return Step("compile", "compile", command, box_s=100, min_s=45, output="compile.jsonl")


def attention_step(s: Settings) -> Step:
    """One attention layer, forward + backward, at 16,384 tokens: sdpa, eager, the 256-token window."""
    command = [
        s.python,
        "scripts/bench_attention.py",
        "--device",
        s.device,
        "--lengths",
        "64" if s.tiny else "16384",
    ]
    command += ["--variants", *attention_cases(s.root), "--decode-lengths"]
    command += ["--repeats", "1", "--warmup", "0"] if s.tiny else ["--repeats", "5", "--warmup", "2"]
    command += ["--out-csv", str(s.work / "attention.csv"), "--out-png", str(s.work / "attention.png")]
    return Step("attention", "attention", command, box_s=45, min_s=15, output="attention.csv")


def short_train_step(s: Settings) -> Step:
    """The quickstart recipe for two epochs (about 650 steps), validated and decoded: BLEU and speed."""
    run_dir = s.work / "short_train"
    command = [s.python, "train.py", "experiment=quickstart", *device_overrides(s)]
    command += (
        [
            "trainer.max_steps=10",
            "data.max_tokens=800",
            "valid_search.max_len=40",
            "test_search.beam=1",
            "test_search.max_len=40",
        ]
        if s.tiny
        else ["trainer.max_epochs=2"]  # two validations; the better one is decoded
    )
    command += ["trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}"]
    return Step("short-train", "short-train", command, box_s=110, min_s=60, output="short_train/results.json")


def length_step(s: Settings, kernels: tuple[str, ...]) -> Step:
    """One row of the length benchmark (docs/ablation.md, on a GPU): K=256 pairs an example."""
    chosen = ",".join(k for k in ("eager", "sdpa", "sparse", *OPTIONAL_KERNELS) if k in (*kernels, "sparse"))
    if s.tiny:
        shape = ["data.concat=4", "data.max_tokens=1600", "data.max_len=400", "model.max_positions=512"]
        windows = bench_windows(s)
    else:
        shape = [
            "data.concat=256",
            "data.max_tokens=16384",
            "data.max_len=20000",
            "model.max_positions=20480",
        ]
        windows = ["--warmup-steps", "3", "--windows", "3", "--window-steps", "3"]
    command = [s.python, "scripts/bench_train.py", "experiment=ablation_length", *device_overrides(s), *shape]
    command += [f"attention={chosen}", *windows, "--keep-going", "--out", str(s.work / "length.jsonl")]
    return Step("length", "length", command, box_s=80, min_s=30, output="length.jsonl")


def tests_step(s: Settings) -> Step:
    """The GPU tests: the files with a CUDA skip marker, and in them only the tests it marks."""
    files = [str(path.relative_to(s.root)) for path in gpu_test_files(s.root)]
    command = [s.python, "-m", "pytest", "-q", "-m", *CHECK_TESTS, "-p", "helpers.gpu_tests"]
    command += ["-p", "no:cacheprovider", "-rfE", "--junitxml", str(s.work / "tests.xml"), *files]
    if not s.tiny and len(files) > 1:
        command += ["-n", str(min(3, len(files))), "--dist", "loadfile"]  # one worker per file
    return Step("tests", "tests", command, box_s=110, min_s=30, output="tests.xml")


def install_step(s: Settings) -> Step:
    """Where a module the wheels provide is missing, the carried wheels into ``s.site`` (first on every
    step's PYTHONPATH), then an import of each: a wheel that does not fit the image fails here, by name."""
    python, site = shlex.quote(s.python), shlex.quote(str(s.site))
    wheels = f"{shlex.quote(str(s.wheels))}/*.whl"
    names = " ".join(s.imports)
    find = (
        f'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in "{names}".split()))'
    )
    load = f'import {", ".join(s.imports)}; print("imported {names}")'
    pip = f"{python} -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
    script = (
        f"if {python} -c {shlex.quote(find)}; then echo 'found {names}: nothing to install'; exit 0; fi; "
        f"ls {wheels} >/dev/null 2>&1 || {{ echo 'error: {names} missing and no wheels in {s.wheels} "
        "(make gpu-bundle, then carry .whl)'; exit 1; }; "
        f"{pip} --target {site} {wheels} && echo installed $(ls {wheels} | wc -l) wheels into {site} && "
        f"{python} -c {shlex.quote(load)}"
    )
    return Step("install", "install", ["bash", "-c", script], box_s=90, min_s=10)


def plan(s: Settings) -> list[Step]:
    """Every step of the check, in the order they run."""
    kernels = s.kernels or detected_kernels(s.root)
    env = [s.python, "-m", "app.bench.gpu_env", "--out", str(s.work / "env.json")]
    steps = [Step("env", "env", env, box_s=60, min_s=5, output="env.json"), install_step(s), tests_step(s)]
    steps.append(attention_step(s))  # seconds, and no corpus to prepare
    steps += [train_step(s, kernel, first=i == 0) for i, kernel in enumerate(kernels)]
    steps += [compile_step(s), short_train_step(s), length_step(s, kernels)]
    return steps


def select(steps: list[Step], only: list[str] | None) -> list[Step]:
    """The steps named in ``only`` (a kind, e.g. ``train``, names all of its steps), in plan order."""
    if not only:
        return steps
    known = {step.name for step in steps} | {step.kind for step in steps}
    unknown = [name for name in only if name not in known]
    if unknown:
        raise ValueError(f"unknown step(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    return [step for step in steps if step.name in only or step.kind in only]
