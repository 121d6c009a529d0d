"""The house's shape, checked from the code: imports run downwards only, and modules stay small.

The layer order is stated once, in the README's Layout section (the line that starts with
``Layer order``); these tests read it there and check every ``app`` import against it, function-level
imports included. A package may import its own modules and anything in a lower layer; packages that
share a layer (``data`` and ``decoding``, say) are independent of each other.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.training import REPO_ROOT

APP = REPO_ROOT / "app"
MAX_MODULE_LINES = 400


def stated_layers() -> list[list[str]]:
    """The README's layer order, lowest first: ``io, hardware < attention < ...`` as groups of names."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^Layer order[^:]*:\s*(.+)$", readme, re.MULTILINE)
    assert found, "README.md states no 'Layer order, lowest first: a, b < c < ...' line"
    text = found.group(1).replace("`", "").rstrip(".")
    return [[name.strip() for name in group.split(",")] for group in text.split("<")]


def component(module: str) -> str:
    """``app.attention.kernels.sparse`` -> ``attention``; ``app.io`` -> ``io``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def app_modules() -> dict[str, Path]:
    return {".".join(p.relative_to(REPO_ROOT).with_suffix("").parts): p for p in sorted(APP.rglob("*.py"))}


def imported_app_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of an ``app`` module in ``path``, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == "app" or name.startswith("app.")]
    return found


def test_every_part_of_app_has_a_stated_layer() -> None:
    layers = stated_layers()
    stated = [name for group in layers for name in group]
    assert len(stated) == len(set(stated)), f"a name appears twice in the README's layer order: {stated}"
    parts = {component(m) for m in app_modules()} - {"__init__"}
    assert parts <= set(stated), f"parts of app/ missing from the README's layer order: {parts - set(stated)}"
    assert set(stated) <= parts, f"the README's layer order names what app/ lacks: {set(stated) - parts}"


def test_imports_run_from_higher_layers_to_lower_ones() -> None:
    rank = {name: level for level, group in enumerate(stated_layers()) for name in group}
    upward = []
    for module, path in app_modules().items():
        here = component(module)
        for line, imported in imported_app_modules(path):
            there = component(imported)
            if there != here and there in rank and rank[there] >= rank.get(here, -1):
                upward.append(f"{path.relative_to(REPO_ROOT)}:{line} ({here}) imports {imported} ({there})")
    assert not upward, "imports that do not run downwards:\n  " + "\n  ".join(upward)


@pytest.mark.parametrize("path", sorted(APP.rglob("*.py")), ids=lambda p: str(p.relative_to(APP)))
def test_no_module_is_longer_than_400_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO_ROOT)} has {lines} lines: split it by job"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The import walk finds imports inside functions too (where upward imports used to hide)."""
    source = tmp_path / "mod.py"
    source.write_text("import os\n\ndef f():\n    from app.inference.torch_engine import TorchEngine\n")
    assert imported_app_modules(source) == [(4, "app.inference.torch_engine")]


@pytest.mark.parametrize(
    "module",
    ["app.inference.run_scoring", "app.inference.cli", "app.serving.api", "app.models", "app.decoding"],
)
def test_inference_and_the_model_code_run_without_lightning(module: str) -> None:
    """Rescoring, translating and serving a checkpoint load no Lightning and no Hydra (fresh process)."""
    frameworks = "{'pytorch_lightning', 'lightning', 'hydra'}"
    probe = f"import sys, {module}; print(sorted({frameworks} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert loaded.stdout.strip() == "[]", f"importing {module} loads {loaded.stdout.strip()}"


def test_the_attention_package_draws_nothing() -> None:
    """Figures belong above the kernels: nothing in app/attention imports matplotlib."""
    drawing = []
    for path in sorted((APP / "attention").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            drawing += [
                f"{path.relative_to(REPO_ROOT)}: {n}" for n in names if n.split(".")[0] == "matplotlib"
            ]
    assert not drawing, f"plots belong above app/attention: {drawing}"


def import_graph() -> dict[str, set[str]]:
    """Each ``app`` module -> the ``app`` modules it imports (module- and function-level), a name imported
    from a package resolved to its submodule where it is one (``from app.x import y`` -> ``app.x.y``)."""
    modules = {m.removesuffix(".__init__"): p for m, p in app_modules().items()}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                named = {f"{node.module}.{a.name}" for a in node.names}
                edges |= (named & modules.keys()) or {node.module}
        graph[module] = edges - {module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each one found as a path that comes back to its start."""
    found, state = [], dict.fromkeys(graph, 0)  # 0 unseen, 1 on the current path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                found.append([*path[path.index(imported) :], imported])
            elif state.get(imported) == 0:
                visit(imported, [*path, imported])
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [module])
    return found


def test_no_import_circle_in_app() -> None:
    """No module reaches itself through imports, at any depth of a file: a circle is an import that had
    to hide inside a function, or a package whose parts cannot be read in order."""
    assert not circles(import_graph()), "import circles:\n  " + "\n  ".join(
        " -> ".join(c) for c in circles(import_graph())
    )


def test_the_circle_check_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_models_know_nothing_of_acceleration() -> None:
    """Model families define models: no module of app/models imports app.acceleration (it wraps them)."""
    graph = import_graph()
    found = {
        m: sorted(e) for m, e in graph.items() if m.startswith("app.models") for i in e if "acceleration" in i
    }
    assert not found, f"models importing acceleration: {found}"
