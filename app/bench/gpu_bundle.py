"""What the GPU check needs on the lent GPU machine that its image lacks, carried there as wheels.

    python scripts/gpu_bundle.py              # = make gpu-bundle: wheels into .whl/, sizes, the run call
    python scripts/gpu_bundle.py --dry-run    # what it would fetch, and whether that covers the imports

The lent machine (an NVIDIA H200 with torch 2.11.0+cu130, Python 3.12) reaches no package index: a
package its image lacks travels in the working tree as a wheel, installed there with
``pip install --no-index --no-deps --target`` (:mod:`app.bench.gpu_check` does that when imports fail).
:data:`IMAGE_PACKAGES` is the image's package list as the workplace's device notes give it (read there on
2026-11-17); :data:`BUNDLE` is what the check needs beyond it, each at the version installed here (the one
this project's tests pass with), one version each, downloaded with ``--no-deps`` for CPython 3.12 on
manylinux x86-64. :func:`unresolved_requirements` checks that every requirement of a bundled package is on
the image or in the bundle; :func:`needed_distributions` that every package the check's code imports at
module level is, by following the imports of its entry points (scripts, train.py, the GPU tests).
Everything travels together under the device tool's 64 MiB limit, so the project's other dependencies
(wandb, the server's, CTranslate2's) stay behind: the check does not import them.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.metadata
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from app.bench.gpu_plan import REPO_ROOT, gpu_test_files

# The image's Python packages ("Python packages already there" in the device notes, 2026-11-17).
IMAGE_LIST = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
    build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
    cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
    equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
    grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
    interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
    lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
    markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
    multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
    nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
    nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
    nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
    onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
    prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
    pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
    setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
    tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
    torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
    typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
    xxhash yarl zipp
"""
IMAGE_PACKAGES = frozenset(IMAGE_LIST.split())
# What the check needs that the image lacks, and why.
BUNDLE: dict[str, str] = {
    "hydra-core": "train.py's configs (every step)",
    "omegaconf": "hydra-core's configs",
    "antlr4-python3-runtime": "omegaconf's and hydra-core's grammar",
    "hydra-joblib-launcher": "experiment=ablation_length (sweep=ablation names its launcher): the length row",
    "datasets": "the corpus' Arrow cache (app/data)",
    "dill": "datasets",
    "multiprocess": "datasets",
    "sacremoses": "BLEU's tokenisation of Moses-escaped text (app/inference/metrics.py)",
}
TARGET = {"python_version": "3.12", "sys_platform": "linux", "platform_machine": "x86_64", "os_name": "posix"}
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
]
DEVICE_LIMIT_MIB = 64  # what may travel to the device machine in one call: working tree + carried paths
OWN_MODULES = ("app", "helpers", "hydra_plugins")  # this checkout's code (tests/helpers is `helpers`)
ENTRY_POINTS = ["train.py", "scripts/bench_train.py", "scripts/bench_attention.py", "app/bench/gpu_env.py"]


def normalize(name: str) -> str:
    """A distribution's name as package indexes compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def unresolved_requirements(requires: dict[str, list[str]]) -> dict[str, list[str]]:
    """Per bundled package, its requirements (``Requires-Dist`` lines, evaluated for CPython 3.12 on
    Linux x86-64, extras left out) that neither the image nor the bundle provides."""
    from packaging.requirements import Requirement  # only where the bundle is made (pip's own)

    have = IMAGE_PACKAGES | {normalize(name) for name in BUNDLE}
    missing: dict[str, list[str]] = {}
    for package, lines in requires.items():
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**TARGET, "extra": ""}):
                continue
            if normalize(req.name) not in have:
                missing.setdefault(package, []).append(str(req))
    return missing


def module_file(name: str, root: Path) -> Path | None:
    """The file of one of this checkout's modules (``helpers.x`` lives under tests/), or None."""
    parts = name.split(".")
    base = root / "tests" if parts[0] == "helpers" else root
    path = base.joinpath(*parts)
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _guarded(node: ast.Try) -> bool:
    """A ``try`` whose handlers catch a failed import: what it imports is optional."""
    names = {ast.unparse(handler.type) for handler in node.handlers if handler.type is not None}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "(ImportError, AttributeError)"})


def file_imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules imported anywhere in a file, third-party ones imported when it is imported): the second
    leaves out imports inside functions (run only on that path), under ``if TYPE_CHECKING`` and in a
    ``try`` that tolerates their absence."""
    every: set[str] = set()
    eager: set[str] = set()

    def visit(nodes: Iterable[ast.AST], at_import: bool) -> None:
        for node in nodes:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            every.update(names)
            if at_import:
                eager.update(names)
            lazy = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            lazy |= isinstance(node, ast.Try) and _guarded(node)
            lazy |= isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            visit(ast.iter_child_nodes(node), at_import and not lazy)

    visit(ast.parse(path.read_text(encoding="utf-8")).body, True)
    return every, eager


def imported_modules(entries: Iterable[Path], root: Path = REPO_ROOT) -> set[str]:
    """Top-level third-party modules that importing ``entries`` imports, following this checkout's own
    modules wherever they are imported (their package ``__init__`` files too)."""
    todo, seen, third_party = list(entries), set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        every, eager = file_imports(path)
        for name in every:
            parts = name.split(".")
            if parts[0] in OWN_MODULES:
                todo.extend(
                    f for i in range(1, len(parts) + 1) if (f := module_file(".".join(parts[:i]), root))
                )
        third_party |= {
            top
            for name in eager
            if (top := name.split(".")[0]) not in OWN_MODULES and top not in sys.stdlib_module_names
        }
    return third_party


@functools.cache
def _owners() -> dict[str, list[str]]:
    """Top-level module -> the distributions installed here that provide it (slow to read: once)."""
    return importlib.metadata.packages_distributions()


def needed_distributions(root: Path = REPO_ROOT) -> dict[str, str]:
    """{top-level module: its distribution} for what the check's entry points import (the scripts it runs,
    train.py, the GPU tests and their conftest files), distributions as installed here."""
    entries = [root / name for name in ENTRY_POINTS]
    entries += [*gpu_test_files(root), root / "tests/conftest.py", root / "tests/integration/conftest.py"]
    entries.append(root / "tests/helpers/gpu_tests.py")
    owners = _owners()
    return {
        module: normalize(owners.get(module, [module])[0]) for module in sorted(imported_modules(entries))
    }


def uncovered(needed: dict[str, str]) -> dict[str, str]:
    """The needed modules whose distribution is neither on the image nor in the bundle."""
    have = IMAGE_PACKAGES | {normalize(name) for name in BUNDLE}
    return {module: dist for module, dist in needed.items() if dist not in have}


def left_behind() -> list[str]:
    """The project's own requirements that stay behind: neither on the image nor in the bundle."""
    from packaging.requirements import Requirement

    try:
        lines = importlib.metadata.requires("attn-mt") or []
    except importlib.metadata.PackageNotFoundError:  # a checkout not installed with pip install -e
        return []
    names = {normalize(Requirement(line).name) for line in lines if "extra ==" not in line}
    return sorted(names - IMAGE_PACKAGES - {normalize(name) for name in BUNDLE})


def download(dest: Path) -> list[Path]:
    """Each bundled package, at the version installed here, as a wheel for CPython 3.12 on manylinux
    x86-64 into ``dest`` (its old wheels removed first: two versions of one package stop the install).
    A pure-Python package published only as a source archive (antlr4-python3-runtime) is built here."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    target = ["--python-version", TARGET["python_version"], "--implementation", "cp"]
    target += [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    for name in BUNDLE:
        spec = f"{name}=={importlib.metadata.version(name)}"
        pip = [sys.executable, "-m", "pip"]
        fetched = subprocess.run(
            [*pip, "download", "-q", "--no-deps", "--only-binary=:all:", *target, "-d", str(dest), spec],
            capture_output=True,
            text=True,
        )
        if fetched.returncode != 0:
            subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(dest), spec], check=True)
    wheels = sorted(dest.glob("*.whl"))
    built_here = [w.name for w in wheels if not w.name.endswith(("-none-any.whl", "-py312-none-any.whl"))]
    if any("-cp3" in name and "-cp312-" not in name for name in built_here):
        raise RuntimeError(f"wheels built for this Python, not 3.12: {built_here}")
    return wheels


def wheel_requires(wheel: Path) -> tuple[str, list[str]]:
    """(name, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode("utf-8").split("\n\n", 1)[0].splitlines()
    name = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("Name:"))
    return name, [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def travelling_bytes(root: Path, carry: list[str]) -> dict[str, int]:
    """Bytes that travel to the device machine: the working tree git sees (tracked and untracked files
    it does not ignore) and each carried path."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sizes = {
        "working tree": sum((root / f).stat().st_size for f in listed.split("\0") if (root / f).is_file())
    }
    for path in carry:
        where = root / path
        files = [where] if where.is_file() else [f for f in where.rglob("*") if f.is_file()]
        sizes[path] = sum(f.stat().st_size for f in files)
    return sizes


def run_call(carry: list[str]) -> str:
    """The device tool's call that runs the check (docs/throughput.md says the same)."""
    return f'run(command="bash scripts/gpu_check.sh $OUT", carry={json.dumps(carry)}, timeout_s=420)'


def report_coverage() -> bool:
    """Print what the check imports and where each comes from; False where something is not covered."""
    needed = needed_distributions()
    bundled = {normalize(name) for name in BUNDLE}
    for module, dist in needed.items():
        where = "image" if dist in IMAGE_PACKAGES else "bundle" if dist in bundled else "MISSING"
        print(f"  {module:20} {dist:24} {where}")
    missing = uncovered(needed)
    if missing:
        print(f"error: the check imports {', '.join(missing)}, neither on the image nor in BUNDLE")
    print(f"left behind (the check does not import them): {', '.join(left_behind()) or 'none'}")
    return not missing


def main(argv: list[str] | None = None) -> int:
    """Check coverage, fetch the wheels, check their requirements, print sizes and the run call."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--dest", type=Path, default=REPO_ROOT / ".whl", help="where the wheels go")
    parser.add_argument("--carry", nargs="*", default=[".whl", "data/multi30k"], help="paths the run carries")
    parser.add_argument("--dry-run", action="store_true", help="check coverage and sizes, fetch nothing")
    args = parser.parse_args(argv)
    print("what the GPU check imports, and where it comes from on the GPU image:")
    ok = report_coverage()
    if args.dry_run:
        requires = {name: importlib.metadata.requires(name) or [] for name in BUNDLE}
    else:
        wheels = download(args.dest)
        requires = dict(map(wheel_requires, wheels))
        for wheel in wheels:
            print(f"  {wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    for package, reqs in unresolved_requirements(requires).items():
        ok = False
        print(f"error: {package} needs {', '.join(reqs)}: neither on the image nor in BUNDLE")
    sizes = travelling_bytes(REPO_ROOT, [p for p in args.carry if (REPO_ROOT / p).exists()])
    for path in args.carry:
        if not (REPO_ROOT / path).exists():
            why = (
                " (make data prepares it: the check's training steps read it)"
                if path.startswith("data/")
                else ""
            )
            print(f"note: {path} is not here{why}")
    total = sum(sizes.values())
    print(", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in sizes.items()), end="")
    print(f"; in all {total / 2**20:.1f} MiB of the device tool's {DEVICE_LIMIT_MIB} MiB")
    if total > DEVICE_LIMIT_MIB * 2**20:
        ok = False
        print(f"error: {total / 2**20:.1f} MiB would not travel (limit {DEVICE_LIMIT_MIB} MiB)")
    print(f"then, with a GPU lent: {run_call(args.carry)}")
    return 0 if ok else 1
