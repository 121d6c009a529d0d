"""AOTInductor packages kept on disk across processes: a model's decoding is compiled once per machine, not
once per process (a package ~13-25 s to build on 2 CPU cores, well under a second to load again).

A package is named by its key (:mod:`app.acceleration.aot_key`: a digest of the code, the module and its
weights, the symbolic sizes, the settings, torch and the CPU), taken before anything is exported: a package
found is loaded without exporting, one missing is exported, compiled and stored.

Where: ``$ATTN_MT_AOT_CACHE``, else ``$XDG_CACHE_HOME/attn-mt/aot``, else ``~/.cache/attn-mt/aot``, created
private to the user (0700). ``ATTN_MT_AOT_CACHE=off`` keeps the packages in a temporary folder that lives as
long as the process (the behaviour without a cache). The folder holds at most ``$ATTN_MT_AOT_CACHE_MB``
megabytes (default 4096): past that, the packages used longest ago are removed.

Trust: loading a package runs the shared library inside it, so a package is loaded only if this cache made
it. The folder must belong to the user and is kept private (0700; a folder owned by someone else is not
used: the packages then live in a temporary folder for the process). It holds a secret key (``key``, 0600,
32 random bytes made at first use), and each package is stored beside its HMAC-SHA256 under that key
(``NAME.pt2.mac``). Before loading, the package's bytes are checked against it: a file this cache did not
write (tampered with, copied in from another machine or user, planted under a digest's name, damaged) is
refused with a warning, removed and built again. Packages are written atomically (a temporary file renamed
into place, its MAC first), so a reader never sees a partial one. Nothing outside this module names a
package's path: not a checkpoint, a config or a request.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CACHE_ENV, LIMIT_ENV = "ATTN_MT_AOT_CACHE", "ATTN_MT_AOT_CACHE_MB"
DEFAULT_LIMIT_MB = 4096
KEY_BYTES = 32


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


class UntrustedFolder(RuntimeError):
    """The cache folder is not the user's own: its packages are not loaded."""


def private_folder(folder: Path) -> Path:
    """``folder`` created if missing, owned by this user and private to them (0700), or UntrustedFolder."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.stat()
    if info.st_uid != os.getuid():
        raise UntrustedFolder(f"{folder} belongs to user id {info.st_uid}, not to this user")
    if info.st_mode & 0o077:
        folder.chmod(0o700)  # ours, but open to others: closed before anything is read from it
    return folder


def signing_key(folder: Path) -> bytes:
    """The folder's secret key, made on first use (0600). A key that is not the user's, not private or
    not of the right size is replaced: the packages signed with it no longer load and are built again."""
    path = folder / "key"
    try:
        info = path.stat()
        key = path.read_bytes()
        if len(key) == KEY_BYTES and info.st_mode & 0o077 == 0 and info.st_uid == os.getuid():
            return key
        path.unlink()
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(KEY_BYTES)
    partial = folder / f".key.{os.getpid()}.partial"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(key)
    try:
        os.link(partial, path)  # first writer wins; a concurrent one reads the winner's key
    except FileExistsError:
        key = path.read_bytes()
    finally:
        partial.unlink(missing_ok=True)
    return key


def mac_path(package: Path) -> Path:
    return package.with_name(package.name + ".mac")


class PackageStore:
    """Where the AOTInductor packages of :mod:`app.acceleration.aot_package` are kept: the cache folder, or
    a temporary one for this process. ``hits`` counts the packages found already built."""

    def __init__(self) -> None:
        self.folder = cache_folder()
        self._temporary: tempfile.TemporaryDirectory | None = None
        if self.folder is not None:
            try:
                private_folder(self.folder)
            except (UntrustedFolder, OSError) as error:
                reason = f"package cache not used ({error}); packages kept for this process"
                warnings.warn(reason, stacklevel=3)
                self.folder = None
        if self.folder is None:
            self._temporary = tempfile.TemporaryDirectory(prefix="attn-mt-aot-")
            self.folder = Path(self._temporary.name)
        self.key = signing_key(self.folder)
        self.hits = 0

    @property
    def persistent(self) -> bool:
        return self._temporary is None

    def note(self, model: str, name: str) -> None:
        """Note that the package ``name`` of the model with id ``model`` is in the folder (for estimates of
        what using packages would cost: :mod:`app.acceleration.auto`; never for choosing what to load)."""
        notes = self.folder / "built"
        notes.mkdir(mode=0o700, exist_ok=True)
        if name not in self.noted(model):
            with open(notes / model, "a", encoding="utf-8") as file:
                file.write(name + "\n")

    def noted(self, model: str) -> set[str]:
        """The names noted for the model with id ``model`` (see :meth:`note`)."""
        try:
            return set((self.folder / "built" / model).read_text(encoding="utf-8").split())
        except (FileNotFoundError, UnicodeDecodeError, NotADirectoryError):
            return set()

    def signature(self, data: bytes) -> bytes:
        return hmac.new(self.key, data, hashlib.sha256).digest()

    def trusted(self, path: Path) -> bool:
        """Whether ``path`` holds the bytes this cache wrote there (its MAC matches)."""
        try:
            expected = mac_path(path).read_bytes()
        except FileNotFoundError:
            return False
        return hmac.compare_digest(self.signature(path.read_bytes()), expected)

    def load_or_build(
        self,
        key: str,
        name: str,
        export: Callable[[], torch.export.ExportedProgram],
        configs: dict[str, Any],
    ) -> Any:
        """The loaded package named by ``key`` (``name`` says what it is, for a person reading the folder):
        found and trusted, or the program ``export()`` gives compiled with ``configs``, signed and stored."""
        path = self.folder / f"{name}-{key[:32]}.pt2"
        if path.exists() and (runner := self.load_trusted(path)) is not None:
            os.utime(path)  # used now: the last to be pruned
            self.hits += 1
            return runner
        self.build(export(), path, configs)
        if self.persistent:
            prune(self.folder, size_limit(), keep=path)
        return torch._inductor.aoti_load_package(str(path))

    def load_trusted(self, path: Path) -> Any | None:
        """The package at ``path`` loaded, or None (warned, the file removed) where this cache did not make
        it or it does not load."""
        if not self.trusted(path):
            reason = "not made by this cache (tampered with, foreign or damaged)"
        else:
            try:
                return torch._inductor.aoti_load_package(str(path))
            except Exception as error:
                reason = f"did not load ({type(error).__name__}: {error})"
        warnings.warn(f"{path} refused: {reason}; building it again", stacklevel=4)
        path.unlink(missing_ok=True)
        mac_path(path).unlink(missing_ok=True)
        return None

    def build(self, program: torch.export.ExportedProgram, path: Path, configs: dict[str, Any]) -> None:
        """Compile ``program`` into ``path``, its MAC written first, each renamed into place."""
        partial = self.folder / f".{path.stem}.{os.getpid()}.partial.pt2"
        signed = mac_path(partial)
        try:
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(partial), inductor_configs=configs
            )
            partial.chmod(0o600)
            signed.write_bytes(self.signature(partial.read_bytes()))
            signed.chmod(0o600)
            os.replace(signed, mac_path(path))
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
            signed.unlink(missing_ok=True)


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
            mac_path(path).unlink(missing_ok=True)
            total -= size
            removed.append(path)
    return removed
