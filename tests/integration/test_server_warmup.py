"""A server with compiled decoding steps compiles before it listens, so its first request is answered in
time: without the warm-up that request would wait out the compile and get 503 past a deadline shorter
than the compile."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.server import TIMEOUT, running_server

from app.acceleration.compiled_step import compile_available
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
def test_compiled_steps_are_paid_before_the_first_request(checkpoint: Path) -> None:
    engine = open_engine(checkpoint, compile="on")
    started = time.perf_counter()
    report = warm_up(engine)
    warm_seconds = time.perf_counter() - started
    assert report is not None and report.startswith("decoding steps compiled:")
    graphs = int(report.split("compiled: ")[1].split(" graphs")[0])
    assert graphs >= 2  # batch 1 and more rows at least
    # half of what the compile took (the first request would otherwise have waited that long), not a fixed
    # figure: a fast CPU with a warm inductor cache compiles these graphs in a second or two
    deadline = max(0.5, warm_seconds / 2)
    assert warm_seconds > deadline
    limits = ServerLimits(request_timeout_s=deadline, max_wait_ms=10.0)
    sentences = ["Ein Hund läuft.", "Zwei Männer spielen im Park."]
    with running_server(create_app(engine, limits)) as (url, _):
        for body in ({"sentences": sentences[:1], "beam": 1}, {"sentences": sentences}):
            response = httpx.post(f"{url}/translate", json=body, timeout=TIMEOUT)
            assert response.status_code == 200, response.text
    expected = engine.translate(sentences, SearchSettings(beam=5))
    assert response.json() == {"translations": expected}
