"""app.hardware: fast-bf16 detection from the CPU's feature flags (a public interface, /proc/cpuinfo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.hardware import cpu_flags, cpu_has_fast_bf16, resolve_precision

X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 {extra}\n\nprocessor\t: 1\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve {extra}\n"


@pytest.mark.parametrize(
    ("text", "fast"),
    [
        (X86.format(extra=""), False),
        (X86.format(extra="avx512f avx512bw"), False),  # AVX-512 without BF16: bf16 is emulated
        (X86.format(extra="avx512f avx512_bf16"), True),
        (X86.format(extra="amx_tile amx_bf16"), True),
        (ARM.format(extra=""), False),
        (ARM.format(extra="bf16 i8mm"), True),
        ("processor\t: 0\n", False),  # no flags line at all
    ],
    ids=["avx2", "avx512", "avx512_bf16", "amx", "arm", "arm_bf16", "no_flags"],
)
def test_fast_bf16_follows_the_cpu_flags(tmp_path: Path, text: str, fast: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    assert cpu_has_fast_bf16(cpuinfo) is fast


def test_without_cpuinfo_the_answer_is_no(tmp_path: Path) -> None:
    assert cpu_flags(tmp_path / "missing") == frozenset()
    assert cpu_has_fast_bf16(tmp_path / "missing") is False


def test_only_auto_is_resolved() -> None:
    assert resolve_precision("16-mixed", "cpu") == "16-mixed"
    assert resolve_precision("auto", "cpu") == ("bf16-mixed" if cpu_has_fast_bf16() else "32-true")
