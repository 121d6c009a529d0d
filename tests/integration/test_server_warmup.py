"""A server with compiled decoding builds its packages before it listens, so its first request is answered
in time: without the warm-up that request would wait out the build and get 503 past a deadline shorter
than the build."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.server import TIMEOUT, running_server

from app.acceleration.step import compile_available
from app.inference.engine import SearchSettings
from app.inference.engines import open_engine
from app.serving import ServerLimits, create_app
from app.serving.warmup import warm_up

pytestmark = [
    pytest.mark.usefixtures("single_torch_thread"),
    pytest.mark.skipif(compile_available() is not None, reason="inductor finds no C++ compiler here"),
]


@pytest.fixture(scope="module")
def checkpoint(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("warmup") / "model.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    return path


def test_an_eager_engine_needs_no_warm_up(checkpoint: Path) -> None:
    assert warm_up(open_engine(checkpoint)) is None


@pytest.mark.slow
def test_packages_are_paid_before_the_first_request(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTN_MT_AOT_CACHE", str(tmp_path))  # its own cache: built here, whatever ran before
    engine = open_engine(checkpoint, compile="aot")
    started = time.perf_counter()
    report = warm_up(engine, beams=(1,), counts=(1,))  # one shape: fewer packages to build in a test
    warm_seconds = time.perf_counter() - started
    assert report is not None and report.startswith("decoding compiled ahead of time:")
    packages = int(report.split("time: ")[1].split(" package")[0])
    assert packages == 3  # the encoder, the first step and the later steps of one sentence
    # half of what the build took (the first request would otherwise have waited that long), not a fixed
    # figure: a fast CPU with the packages already in the cache loads them in a second or two
    deadline = max(0.5, warm_seconds / 2)
    assert warm_seconds > deadline
    limits = ServerLimits(request_timeout_s=deadline, max_wait_ms=10.0)
    sentences = ["Ein Hund läuft.", "Zwei Männer spielen im Park."]
    with running_server(create_app(engine, limits)) as (url, _):
        for sentence in sentences:  # one request each: the warmed shape
            response = httpx.post(
                f"{url}/translate", json={"sentences": [sentence], "beam": 1}, timeout=TIMEOUT
            )
            assert response.status_code == 200, response.text
    expected = engine.translate(sentences[-1:], SearchSettings(beam=1))
    assert response.json() == {"translations": expected}
