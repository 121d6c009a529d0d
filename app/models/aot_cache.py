"""AOTInductor packages kept on disk across processes: ``--compile aot`` compiles a model's decoding steps
once per machine, not once per process (a package ~13-25 s to build on 2 CPU cores, ~1 s to find again).

A package is named by a digest of everything that decides what it computes: the exported program (its
graph's code, signature and the ranges of its symbolic sizes), the bytes of every weight and constant it
holds, the inductor settings it is compiled with, the torch and Python versions, and the CPU (model and
flags: its C++ is built for the machine's vector instructions). Exporting the step (~1 s) comes before the
lookup, so a change to the model's code, its weights or its kernel settings names another package; an
entry is never reused for a different computation.

Where: ``$ATTN_MT_AOT_CACHE``, else ``$XDG_CACHE_HOME/attn-mt/aot``, else ``~/.cache/attn-mt/aot``, created
private to the user (0700). ``ATTN_MT_AOT_CACHE=off`` keeps the packages in a temporary folder that lives as
long as the process (the behaviour without a cache). The folder holds at most ``$ATTN_MT_AOT_CACHE_MB``
megabytes (default 4096): past that, the packages used longest ago are removed.

Trust: loading a package runs the shared library inside it, so the folder is treated like inductor's own
cache of compiled kernels: it is the user's, and only this module writes into it, atomically (a temporary
file renamed into place, so a reader never sees a partial package). A package that fails to load is
removed and built again.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from app.hardware import cpu_flags, cpu_model

CACHE_ENV, LIMIT_ENV = "ATTN_MT_AOT_CACHE", "ATTN_MT_AOT_CACHE_MB"
DEFAULT_LIMIT_MB = 4096
FORMAT = "1"  # bumped when what goes into the digest changes


def cache_folder() -> Path | None:
    """The folder packages are kept in across processes, or None (``ATTN_MT_AOT_CACHE=off``)."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("off", "") else Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attn-mt" / "aot"


def size_limit() -> int:
    """Bytes the folder may hold (``ATTN_MT_AOT_CACHE_MB``); a bad value names the variable."""
    text = os.environ.get(LIMIT_ENV, str(DEFAULT_LIMIT_MB))
    try:
        megabytes = float(text)
    except ValueError:
        raise ValueError(f"{LIMIT_ENV}={text!r}: expected a number of megabytes") from None
    return int(megabytes * 2**20)


def program_digest(program: torch.export.ExportedProgram, configs: dict[str, Any]) -> str:
    """sha256 of what a package of ``program`` compiled with ``configs`` computes (see the module doc)."""
    digest = hashlib.sha256()
    for part in (
        FORMAT,
        torch.__version__,
        sys.version.split()[0],
        cpu_model(),
        " ".join(sorted(cpu_flags())),
        repr(sorted(configs.items())),
        program.graph_module.code,
        str(program.graph_signature),
        str(program.range_constraints),
    ):
        digest.update(part.encode("utf-8") + b"\0")
    for name, value in sorted({**program.state_dict, **program.constants}.items()):
        digest.update(name.encode("utf-8") + b"\0")
        if isinstance(value, torch.Tensor):
            digest.update(f"{value.dtype} {tuple(value.shape)}".encode())
            digest.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(repr(value).encode("utf-8"))
    return digest.hexdigest()


class PackageStore:
    """Where :class:`~app.models.aot_step.AotSteps` keeps its packages: the cache folder, or a temporary
    one for this process. ``hits`` counts the packages found already built."""

    def __init__(self) -> None:
        self.folder = cache_folder()
        self._temporary: tempfile.TemporaryDirectory | None = None
        if self.folder is None:
            self._temporary = tempfile.TemporaryDirectory(prefix="attn-mt-aot-")
            self.folder = Path(self._temporary.name)
        else:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.hits = 0

    @property
    def persistent(self) -> bool:
        return self._temporary is None

    def load_or_build(self, program: torch.export.ExportedProgram, name: str, configs: dict[str, Any]) -> Any:
        """The loaded package of ``program`` (``name`` says what it is, for a person reading the folder):
        found by its digest, or compiled with ``configs``, stored and loaded."""
        path = self.folder / f"{name}-{program_digest(program, configs)[:24]}.pt2"
        if path.exists():
            try:
                runner = torch._inductor.aoti_load_package(str(path))
            except Exception as error:  # a damaged or foreign file: build it again
                reason = f"{type(error).__name__}: {error}"
                warnings.warn(f"{path} did not load ({reason}); building it again", stacklevel=2)
                path.unlink(missing_ok=True)
            else:
                os.utime(path)  # used now: the last to be pruned
                self.hits += 1
                return runner
        partial = self.folder / f".{path.stem}.{os.getpid()}.partial.pt2"
        try:
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(partial), inductor_configs=configs
            )
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        if self.persistent:
            prune(self.folder, size_limit(), keep=path)
        return torch._inductor.aoti_load_package(str(path))


def prune(folder: Path, limit: int, keep: Path) -> list[Path]:
    """Remove the packages in ``folder`` used longest ago until they hold at most ``limit`` bytes (never
    ``keep``, the one just built); returns the removed paths. Another process may be pruning too: a file
    gone meanwhile is skipped."""
    found = []  # (last used, bytes, path)
    for path in folder.glob("*.pt2"):
        try:
            info = path.stat()
        except FileNotFoundError:
            continue
        if not path.name.startswith("."):  # not a package being built
            found.append((info.st_mtime, info.st_size, path))
    total, removed = sum(size for _, size, _ in found), []
    for _, size, path in sorted(found):
        if total <= limit:
            break
        if path != keep:
            path.unlink(missing_ok=True)
            total -= size
            removed.append(path)
    return removed
