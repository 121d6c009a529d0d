"""scripts/serve.py and scripts/bench_server.py as a user runs them: the benchmark starts the server on
a loopback port, measures each concurrency, records the CPU, and shuts the server down."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.training import subprocess_env

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--max-queued=0", "max_queued"),
        ("--request-timeout=0", "request_timeout_s"),
        ("--max-request-tokens=-1", "max_request_tokens"),
        ("--stuck-after=0", "stuck_after_s"),
        ("--header-timeout=0", "header_timeout_s"),
        ("--max-connections=0", "max_connections"),
    ],
)
def test_serve_refuses_a_bad_limit_before_opening_the_model(
    flag: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_script("serve").main([str(tmp_path / "missing.ckpt"), flag]) == 2
    assert field in capsys.readouterr().err


@pytest.mark.slow
def test_bench_server_measures_each_concurrency(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    checkpoint = tmp_path / "model.ckpt"
    checkpoint_factory(checkpoint, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    out = tmp_path / "bench.json"
    # --compile off: what is measured here is the benchmark's loop, not the server's packages, whose build
    # before listening tests/integration/test_server_warmup.py checks (it cost this test ~25 s)
    command = [sys.executable, str(SCRIPTS / "bench_server.py"), str(checkpoint), "--engine", "torch"]
    command += ["--compile", "off"]
    command += ["--concurrency", "1", "4", "--seconds", "2", "--requests", "12", "--json", str(out)]
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["engine"] == "torch" and record["compile"] == "off" and record["cpu_model"]
    assert [level["concurrency"] for level in record["levels"]] == [1, 4]
    for level in record["levels"]:
        assert level["requests"] > 0 and level["failures"] == {}
        assert 0 < level["p50_ms"] <= level["p99_ms"]
    assert "| torch | 4 |" in result.stdout
