"""The AOTInductor package cache: where it lives, what names a package, what it trusts (only packages it
signed, in a folder of the user's own), damaged and planted files, the size bound."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from app.acceleration.aot_cache import (
    PackageStore,
    cache_folder,
    mac_path,
    program_digest,
    prune,
    signing_key,
    size_limit,
)


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
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


def exported(module: torch.nn.Module) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=2, max=64)
    return torch.export.export(module, (torch.randn(4, 8),), dynamic_shapes=({0: batch},))


def test_the_digest_names_weights_and_settings() -> None:
    torch.manual_seed(0)
    module = Scale()
    digest = program_digest(exported(module), {"freezing": False})
    assert digest == program_digest(exported(module), {"freezing": False})  # exporting again: the same
    assert digest != program_digest(exported(module), {"freezing": True})
    with torch.no_grad():
        module.linear.bias[0] += 1e-6
    assert digest != program_digest(exported(module), {"freezing": False})


def test_a_package_is_found_again_and_a_damaged_one_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "packages"
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(folder))
    torch.manual_seed(0)
    module, x = Scale(), torch.randn(5, 8)
    expected = module(x)
    first = PackageStore()
    assert first.persistent
    torch.testing.assert_close(first.load_or_build(exported(module), "scale", {})(x), expected)
    (package,) = folder.glob("scale-*.pt2")
    assert first.hits == 0 and folder.stat().st_mode & 0o077 == 0  # made private to the user

    second = PackageStore()  # as another process would
    torch.testing.assert_close(second.load_or_build(exported(module), "scale", {})(x), expected)
    assert second.hits == 1

    package.write_bytes(b"not a package")
    third = PackageStore()
    with pytest.warns(UserWarning, match="refused: not made by this cache"):
        runner = third.load_or_build(exported(module), "scale", {})
    torch.testing.assert_close(runner(x), expected)
    assert third.hits == 0 and package.stat().st_size > 100


def test_a_planted_package_is_refused_and_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real, loadable package of another computation put under a package's name (as an attacker with
    the folder, or a copy from another machine, would) is never run: its MAC does not match this cache's
    key. Nor is a planted package with a MAC made under another key."""
    folder = tmp_path / "packages"
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(folder))
    torch.manual_seed(0)
    module, other, x = Scale(), Scale(), torch.randn(5, 8)
    store = PackageStore()
    store.load_or_build(exported(module), "scale", {})
    store.load_or_build(exported(other), "other", {})
    (package,) = folder.glob("scale-*.pt2")
    (foreign,) = folder.glob("other-*.pt2")
    package.write_bytes(foreign.read_bytes())  # loadable, but computes `other`
    with pytest.warns(UserWarning, match="refused: not made by this cache"):
        runner = PackageStore().load_or_build(exported(module), "scale", {})
    torch.testing.assert_close(runner(x), module(x))

    elsewhere = tmp_path / "elsewhere"  # another cache (another user or machine) signs with its own key
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(elsewhere))
    PackageStore().load_or_build(exported(other), "scale-planted", {})
    (signed_elsewhere,) = elsewhere.glob("scale-planted-*.pt2")
    package.write_bytes(signed_elsewhere.read_bytes())
    mac_path(package).write_bytes(mac_path(signed_elsewhere).read_bytes())
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(folder))
    store = PackageStore()
    with pytest.warns(UserWarning, match="refused"):
        runner = store.load_or_build(exported(module), "scale", {})
    torch.testing.assert_close(runner(x), module(x))
    assert store.hits == 0 and store.trusted(package)


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
