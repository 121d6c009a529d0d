"""app.hardware: fast-bf16 detection from the CPU's feature flags (a public interface, /proc/cpuinfo) and,
on a GPU, from native (not emulated) bf16; ``precision=auto`` and ``make demo``'s recipe following that one
rule; and no peak measured for a dtype without a fast path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.hardware import (
    cpu_flags,
    cpu_has_fast_bf16,
    fast_bf16,
    has_fast_matmul,
    matmul_peak_tflops,
    resolve_precision,
)
from app.training.recipes import BF16_RECIPE, choose_recipe, measure_matmul

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


def a_gpu(monkeypatch: pytest.MonkeyPatch, *, native_bf16: bool) -> None:
    """This process sees one GPU: an Ampere-or-later one (bf16 in hardware) or an older one, on which
    ``torch.cuda.is_bf16_supported()`` is True all the same (torch emulates bf16 there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: native_bf16 or including_emulation
    )


@pytest.mark.parametrize("native_bf16", [True, False], ids=["native", "emulated"])
def test_precision_auto_and_make_demo_follow_one_rule_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch, native_bf16: bool
) -> None:
    a_gpu(monkeypatch, native_bf16=native_bf16)
    assert fast_bf16("cuda") is native_bf16
    assert resolve_precision("auto", "auto") == ("bf16-mixed" if native_bf16 else "32-true")
    assert (choose_recipe(measure_matmul()).experiment == BF16_RECIPE) is native_bf16


def test_a_torch_without_the_emulation_argument_asks_the_compute_capability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)  # emulated bf16 counted
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))  # a V100
    assert fast_bf16("cuda") is False


def test_no_bf16_product_runs_for_a_peak_where_the_cpu_lacks_fast_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an AVX2-only CPU one emulated bf16 2048 product takes seconds: the peak is None, unmeasured."""
    slow, fast = tmp_path / "avx2", tmp_path / "avx512_bf16"
    slow.write_text(X86.format(extra="avx512f"))
    fast.write_text(X86.format(extra="avx512f avx512_bf16"))
    dtypes: list[torch.dtype] = []
    matmul = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: dtypes.append(a.dtype) or matmul(a, b))

    assert not has_fast_matmul(torch.bfloat16, "cpu", slow) and has_fast_matmul(torch.float32, "cpu", slow)
    assert matmul_peak_tflops(torch.bfloat16, size=32, repeats=1, cpuinfo=slow) is None
    assert dtypes == []
    assert matmul_peak_tflops(torch.float32, size=32, repeats=1, cpuinfo=slow) > 0
    assert matmul_peak_tflops(torch.bfloat16, size=32, repeats=1, cpuinfo=fast) > 0
    assert dtypes == [torch.float32] * 2 + [torch.bfloat16] * 2  # warm-up + one timed product each
