"""The package layers, read from the imports: the core (attention, models, decoding, data) imports
nothing above itself, and the measuring wing (app/bench) is imported by nothing in app/.

Every ``import``/``from ... import`` counts, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
LOW = {"io", "hardware", "ranks"}  # single modules below every package
ALLOWED = {  # what each core package may import from app/, besides itself
    "attention": LOW,
    "models": LOW | {"attention"},
    "decoding": LOW | {"attention", "models"},
    "data": LOW,
}


def imported_modules(path: Path) -> set[str]:
    """The absolute module names ``path`` imports (``app.x.y``, ``torch``, ...)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def app_imports(package: str) -> dict[str, set[str]]:
    """{file: the app/ packages or modules it imports} over every file of ``app/package``."""
    return {
        str(path.relative_to(APP.parent)): {
            name.split(".")[1] for name in imported_modules(path) if name.startswith("app.")
        }
        for path in sorted((APP / package).rglob("*.py"))
    }


def test_the_core_imports_nothing_above_itself() -> None:
    upward = {
        file: sorted(targets - ALLOWED[package] - {package})
        for package in ALLOWED
        for file, targets in app_imports(package).items()
        if targets - ALLOWED[package] - {package}
    }
    assert not upward, f"core modules import from higher layers: {upward}"


def test_nothing_in_app_imports_the_measuring_wing() -> None:
    importers = [
        str(path.relative_to(APP.parent))
        for path in sorted(APP.rglob("*.py"))
        if path.parent.name != "bench"
        and any(n.split(".")[:2] == ["app", "bench"] for n in imported_modules(path))
    ]
    assert not importers, f"app/bench is the top layer, yet these import it: {importers}"


def test_the_attention_package_draws_nothing() -> None:
    drawing = [
        str(path.relative_to(APP.parent))
        for path in sorted((APP / "attention").rglob("*.py"))
        if any(name.split(".")[0] == "matplotlib" for name in imported_modules(path))
    ]
    assert not drawing, f"plots belong above app/attention: {drawing}"
