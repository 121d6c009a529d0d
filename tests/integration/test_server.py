"""The HTTP server, for real: uvicorn on a loopback ephemeral port in a thread, httpx as the client.

Every answer is checked against the engine called directly, so merging requests into shared batches
must not change a single translation nor its place.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn
from helpers.models import TINY_TRANSFORMER

from app.inference.engines import Engine, open_engine
from app.inference.translator import SearchSettings
from app.serving import ServerLimits, create_app

pytestmark = pytest.mark.usefixtures("single_torch_thread")

LIMITS = ServerLimits(max_request_bytes=2048, max_sentences=8, max_wait_ms=50.0, batch_size=4)
SENTENCES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
TIMEOUT = 60.0  # seconds; every wait in this module is bounded
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def engine(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Engine:
    path: Path = tmp_path_factory.mktemp("serve") / "model.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    return open_engine(path)


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    """A running server's base URL; stopped (and its thread joined) after the module."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine, LIMITS), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=TIMEOUT)
    sock.close()


def post(url: str, body: object) -> httpx.Response:
    return httpx.post(f"{url}/translate", json=body, timeout=TIMEOUT)


def healthy(url: str) -> dict:
    response = httpx.get(f"{url}/health", timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    return response.json()


def test_a_batch_is_answered_in_input_order(url: str, engine: Engine) -> None:
    response = post(url, {"sentences": SENTENCES, "beam": 2})
    assert response.status_code == 200, response.text
    assert response.json() == {"translations": engine.translate(SENTENCES, SearchSettings(beam=2))}
    assert response.json()["translations"][1] == ""  # the blank input keeps its place


def test_nbest_answers_lists_of_scored_hypotheses(url: str, engine: Engine) -> None:
    response = post(url, {"sentences": SENTENCES, "beam": 3, "nbest": 3, "length_penalty": 1.0})
    assert response.status_code == 200, response.text
    got = response.json()["translations"]
    expected = engine.translate_nbest(SENTENCES, SearchSettings(beam=3, nbest=3, alpha=1.0))
    assert len(got) == len(SENTENCES)
    for hyps, want in zip(got, expected, strict=True):
        assert [h["text"] for h in hyps] == [t.text for t in want]
        scores = [h["score"] for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert scores == pytest.approx([t.score for t in want])


def test_concurrent_requests_are_merged_and_each_gets_its_own_answers(url: str, engine: Engine) -> None:
    requests = [
        {"sentences": [f"{s} Nummer {i}." for s in SENTENCES if s], "beam": 1 + i % 2} for i in range(8)
    ]
    expected = [engine.translate(r["sentences"], SearchSettings(beam=r["beam"])) for r in requests]
    before = healthy(url)["batches_run"]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
            return await asyncio.gather(*(client.post("/translate", json=r) for r in requests))

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * len(requests)
    assert [r.json()["translations"] for r in responses] == expected
    assert healthy(url)["batches_run"] - before < len(requests)  # some requests shared an engine call


@pytest.mark.parametrize(
    ("body", "status", "mentions"),
    [
        pytest.param(b"", 400, "empty body", id="empty-body"),
        pytest.param(b"{not json", 422, "invalid", id="not-json"),
        pytest.param(b"[1, 2]", 422, "invalid", id="not-an-object"),
        pytest.param({"sentences": "Ein Satz."}, 422, "sentences", id="sentences-not-a-list"),
        pytest.param({"sentences": ["ok", 3]}, 422, "sentences.1", id="sentence-not-a-string"),
        pytest.param({"sentences": []}, 422, "sentences", id="no-sentences"),
        pytest.param({"sentences": ["a"], "beams": 2}, 422, "beams", id="unknown-option"),
        pytest.param({"sentences": ["a"], "beam": "5"}, 422, "beam", id="option-wrong-type"),
        pytest.param({"sentences": ["a"], "beam": 0}, 422, "beam", id="beam-zero"),
        pytest.param({"sentences": ["a"], "beam": 2, "nbest": 3}, 400, "nbest=3", id="nbest-over-beam"),
        pytest.param({"sentences": ["a"], "sample": "top5"}, 422, "sample", id="bad-sample-spec"),
        pytest.param({"sentences": ["a"] * 9}, 413, "9 sentences", id="too-many-sentences"),
        pytest.param({"sentences": ["a" * 3000]}, 413, "limit", id="too-many-bytes"),
    ],
)
def test_bad_input_is_a_clear_4xx_and_the_server_keeps_serving(
    url: str, body: object, status: int, mentions: str
) -> None:
    if isinstance(body, bytes):
        response = httpx.post(f"{url}/translate", content=body, headers=JSON, timeout=TIMEOUT)
    else:
        response = post(url, body)
    assert response.status_code == status, response.text
    assert mentions in response.text
    assert post(url, {"sentences": ["Ein Hund."]}).status_code == 200


def test_clients_that_disconnect_mid_request_do_not_hurt_the_server(url: str, engine: Engine) -> None:
    host, port = url.removeprefix("http://").split(":")
    body = b'{"sentences": ["Ein Mann schl\xc3\xa4ft.", "Ein Kind lacht."], "beam": 2}'
    head = f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    for sent in (body[:10], body):  # hang up while sending the body, then while waiting for the answer
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as conn:
            conn.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + sent)
    healthy(url)
    sentences = ["Ein Mann schläft.", "Ein Kind lacht."]
    response = post(url, {"sentences": sentences, "beam": 2})
    assert response.json() == {"translations": engine.translate(sentences, SearchSettings(beam=2))}
    deadline = time.monotonic() + TIMEOUT
    while healthy(url)["queued"]:  # the abandoned request does not stay queued
        assert time.monotonic() < deadline
        time.sleep(0.05)
