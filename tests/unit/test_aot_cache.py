"""The AOTInductor package cache: where it lives, what names a package, what it trusts (only packages it
signed, in a folder of the user's own), damaged and planted files, the size bound."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from app.acceleration.aot_cache import PackageStore, cache_folder, mac_path, prune, signing_key, size_limit
from app.acceleration.aot_key import package_key


def test_the_folder_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(tmp_path / "mine"))
    assert cache_folder() == tmp_path / "mine"
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", "off")
    assert cache_folder() is None
    monkeypatch.delenv("ATTN_MT_AOT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "attn-mt" / "aot"


def test_a_bad_size_limit_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTN_MT_AOT_CACHE_MB", "1.5")
    assert size_limit() == int(1.5 * 2**20)
    monkeypatch.setenv("ATTN_MT_AOT_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="ATTN_MT_AOT_CACHE_MB='lots'"):
        size_limit()


def test_prune_removes_the_least_recently_used_but_never_the_new_one(tmp_path: Path) -> None:
    paths = []
    for age, name in enumerate(["new", "recent", "old", "oldest"]):
        path = tmp_path / f"{name}.pt2"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1e9 - age * 100, 1e9 - age * 100))
        paths.append(path)
    (tmp_path / ".building.partial.pt2").write_bytes(b"x" * 1000)  # another process's build: left alone
    oldest_first = list(reversed(paths))
    assert prune(tmp_path, limit=250, keep=paths[-1]) == oldest_first[1:3]  # "oldest" is the one kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [".building.partial.pt2", "new.pt2", "oldest.pt2"]


class Scale(torch.nn.Module):
    def __init__(self, slope: float = 0.0) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.slope = slope  # a plain attribute, as a kernel's options are

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.leaky_relu(self.linear(x), self.slope)


BATCH = torch.export.Dim("batch", min=2, max=64)
ARGS, SHAPES = (torch.randn(4, 8),), ({0: BATCH},)


def load(store: PackageStore, module: torch.nn.Module, name: str) -> object:
    """``module``'s package through ``store``: found by its key, or exported and built."""

    def export() -> torch.export.ExportedProgram:
        return torch.export.export(module, ARGS, dynamic_shapes=SHAPES)

    return store.load_or_build(package_key(module, ARGS, SHAPES, {}), name, export, {})


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Scale, Scale]:
    """A cache folder holding the packages of two modules, built once for the tests that copy it."""
    folder = tmp_path_factory.mktemp("built") / "packages"
    torch.manual_seed(0)
    module, other = Scale(), Scale(slope=0.5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_MT_AOT_CACHE", str(folder))
        store = PackageStore()
        load(store, module, "scale")
        load(store, other, "other")
    return folder, module, other


def copied(built: tuple[Path, Scale, Scale], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the built folder (its key and packages), made the cache folder."""
    folder = tmp_path / "packages"
    shutil.copytree(built[0], folder)
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(folder))
    return folder


def test_the_key_names_code_weights_attributes_and_settings() -> None:
    torch.manual_seed(0)
    module = Scale()
    key = package_key(module, ARGS, SHAPES, {"freezing": False})
    torch.manual_seed(0)
    assert key == package_key(Scale(), ARGS, SHAPES, {"freezing": False})  # built again: the same
    assert key != package_key(module, ARGS, SHAPES, {"freezing": True})
    assert key != package_key(
        module, ARGS, ({0: torch.export.Dim("batch", min=2, max=65)},), {"freezing": False}
    )
    module.slope = 0.1
    assert key != package_key(module, ARGS, SHAPES, {"freezing": False})
    module.slope = 0.0
    with torch.no_grad():
        module.linear.bias[0] += 1e-6
    assert key != package_key(module, ARGS, SHAPES, {"freezing": False})


def test_a_package_is_found_without_exporting_and_a_damaged_one_is_rebuilt(
    built: tuple[Path, Scale, Scale], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = copied(built, tmp_path, monkeypatch)
    _, module, _ = built
    x = torch.randn(5, 8)
    store = PackageStore()  # as another process would
    assert store.persistent and store.key == (folder / "key").read_bytes()

    def no_export() -> torch.export.ExportedProgram:
        raise AssertionError("a package in the cache is loaded without exporting")

    found = store.load_or_build(package_key(module, ARGS, SHAPES, {}), "scale", no_export, {})
    torch.testing.assert_close(found(x), module(x))
    assert store.hits == 1

    (package,) = folder.glob("scale-*.pt2")
    package.write_bytes(b"not a package")
    store = PackageStore()
    with pytest.warns(UserWarning, match="refused: not made by this cache"):
        runner = load(store, module, "scale")
    torch.testing.assert_close(runner(x), module(x))
    assert store.hits == 0 and package.stat().st_size > 100 and store.trusted(package)


def test_a_planted_package_is_refused_and_rebuilt(
    built: tuple[Path, Scale, Scale], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real, loadable package of another computation put under a package's name (as an attacker with
    the folder, or a copy from another machine, would) is never run: its MAC does not match this cache's
    key. Nor is a planted package with a MAC made under another key."""
    folder = copied(built, tmp_path, monkeypatch)
    _, module, _ = built
    x = torch.randn(5, 8)
    (package,) = folder.glob("scale-*.pt2")
    (foreign,) = folder.glob("other-*.pt2")
    package.write_bytes(foreign.read_bytes())  # loadable, but computes `other`
    store = PackageStore()
    assert not store.trusted(package)
    with pytest.warns(UserWarning, match="refused: not made by this cache"):
        runner = load(store, module, "scale")
    torch.testing.assert_close(runner(x), module(x))
    assert store.hits == 0 and store.trusted(package)

    elsewhere = tmp_path / "elsewhere"  # another cache (another user or machine) signs with its own key
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(elsewhere))
    other_store = PackageStore()
    package.write_bytes(foreign.read_bytes())
    mac_path(package).write_bytes(other_store.signature(foreign.read_bytes()))
    assert not store.trusted(package) and other_store.key != store.key


def test_the_folder_is_made_private_and_a_folder_of_another_user_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "packages"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(folder))
    store = PackageStore()
    assert store.persistent and folder.stat().st_mode & 0o777 == 0o700
    key = folder / "key"
    assert key.stat().st_mode & 0o777 == 0o600 and signing_key(folder) == store.key
    key.chmod(0o644)  # readable by others: no longer a secret, so replaced
    assert signing_key(folder) != store.key and key.stat().st_mode & 0o077 == 0
    if os.getuid() != 0:
        return  # only root can hand a folder to another user
    os.chown(folder, 65534, 65534)
    with pytest.warns(UserWarning, match="belongs to user id 65534"):
        store = PackageStore()
    assert not store.persistent and store.folder != folder


def test_off_keeps_packages_for_the_process_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", "off")
    store = PackageStore()
    assert not store.persistent and store.folder.is_dir()
