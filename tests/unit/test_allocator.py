"""glibc's thresholds fixed for decoding (:mod:`app.inference.allocator`), and left alone where the user set
them or the C library is another."""

from __future__ import annotations

import ctypes

import pytest

from app.inference import allocator


def glibc() -> bool:
    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not glibc(), reason="mallopt's thresholds are glibc's")
def test_thresholds_are_set_and_setting_them_again_is_harmless(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in allocator.os.environ if n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    assert allocator.keep_freed_memory() is None
    assert allocator.keep_freed_memory() is None


def test_the_user_s_malloc_variables_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert "MALLOC_" in (allocator.keep_freed_memory() or "")


def test_another_c_library_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class Musl:  # no gnu_get_libc_version
        pass

    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda _name: Musl())
    for name in [n for n in allocator.os.environ if n.startswith("MALLOC_")]:
        monkeypatch.delenv(name)
    assert allocator.keep_freed_memory() == "the C library is not glibc"
