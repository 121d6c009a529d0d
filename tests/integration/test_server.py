"""The HTTP server, for real: uvicorn on a loopback ephemeral port in a thread, httpx as the client.

Every answer is checked against the engine called directly, so merging requests into shared batches
must not change a single translation nor its place.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from helpers.models import TINY_TRANSFORMER
from helpers.server import JSON, TIMEOUT, ScriptedEngine, running_server

from app.inference.engine import Engine, SearchSettings
from app.inference.engines import open_engine
from app.serving import ServerLimits, create_app

pytestmark = pytest.mark.usefixtures("single_torch_thread")

LIMITS = ServerLimits(
    max_request_bytes=2048, max_sentences=8, max_request_tokens=512, max_wait_ms=50.0, batch_size=4
)
SENTENCES = ["Ein Mann fährt Fahrrad.", "", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    """A running server's base URL; stopped (and its thread joined) after the module."""
    with running_server(create_app(engine, LIMITS)) as (base_url, _):
        yield base_url


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
        pytest.param({"sentences": ["a"], "sample": "topk:5", "nbest": 10**9}, 422, "nbest", id="nbest-huge"),
        pytest.param(
            {"sentences": ["ein zwei drei vier"] * 8, "sample": "topk:5", "nbest": 64},
            413,
            "nbest=64",
            id="nbest-counted-in-the-cost",
        ),
        pytest.param({"sentences": ["a b c"] * 8, "beam": 32}, 413, "beam=32", id="beam-counted-in-the-cost"),
        pytest.param(
            {"sentences": ["a"], "sample": "topk:5", "temperature": 1e-300}, 422, "temperature", id="t-tiny"
        ),
        pytest.param(
            b'{"sentences": ["a"], "sample": "topk:5", "temperature": Infinity}',
            422,
            "temperature",
            id="t-inf",
        ),
        pytest.param(
            b'{"sentences": ["a"], "sample": "topk:5", "temperature": NaN}', 422, "temperature", id="t-nan"
        ),
        pytest.param({"sentences": ["a"], "sample": "topk:5", "seed": 10**29}, 422, "seed", id="seed-huge"),
        pytest.param({"sentences": ["a"], "sample": "topk:5", "seed": -1}, 422, "seed", id="seed-negative"),
        pytest.param(b"null", 422, "(body)", id="null-body"),
        pytest.param(b'{"sentences": ["ok", "\\ud800 x"]}', 422, "sentence 1 is not", id="lone-surrogate"),
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


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        pytest.param("text/plain", b'{"sentences": ["a"]}', id="text-plain"),
        pytest.param("application/x-www-form-urlencoded", b'{"sentences": ["a"]}', id="form"),
        pytest.param("multipart/form-data; boundary=x", b"--x--", id="multipart"),
        pytest.param(None, b'{"sentences": ["a"]}', id="no-content-type"),
    ],
)
def test_a_body_not_declared_json_is_415(url: str, content_type: str | None, body: bytes) -> None:
    """What a web page may POST to a loopback server without a CORS preflight is refused unread."""
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(f"{url}/translate", content=body, headers=headers, timeout=TIMEOUT)
    assert response.status_code == 415, response.text
    assert "application/json" in response.json()["error"]
    charset = {"Content-Type": "application/json; charset=utf-8"}
    ok = httpx.post(f"{url}/translate", content=b'{"sentences": ["a"]}', headers=charset, timeout=TIMEOUT)
    assert ok.status_code == 200, ok.text


def test_the_extreme_values_allowed_translate(url: str, engine: Engine) -> None:
    """The bounds are where decoding still works: each allowed extreme gives an answer, not a 500."""
    for extreme in ({"temperature": 0.01, "seed": 2**32 - 1}, {"temperature": 100.0, "seed": 0}):
        body = {"sentences": SENTENCES[:1], "sample": "topk:5", "nbest": 2, **extreme}
        response = post(url, body)
        assert response.status_code == 200, response.text
        assert len(response.json()["translations"][0]) == 2


def test_openapi_documents_the_bodies_and_every_error(url: str) -> None:
    spec = httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json()
    operation = spec["paths"]["/translate"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/TranslateRequest")
    request_schema = spec["components"]["schemas"]["TranslateRequest"]
    assert request_schema["properties"]["nbest"]["maximum"] == 64
    assert request_schema["additionalProperties"] is False
    responses = operation["responses"]
    assert responses["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/TranslateResponse")
    for status in ("400", "408", "413", "415", "422", "500", "503"):
        assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    health = spec["paths"]["/health"]["get"]["responses"]
    assert health["503"]["content"]["application/json"]["schema"]["$ref"].endswith("/Health")
    assert httpx.get(f"{url}/docs", timeout=TIMEOUT).status_code == 200


def test_attention_maps_come_with_the_translations_they_belong_to(url: str, engine: Engine) -> None:
    sentences = [SENTENCES[0], "", SENTENCES[2]]
    response = post(url, {"sentences": sentences, "beam": 2, "attention": True})
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["translations"] == engine.translate(sentences, SearchSettings(beam=2))
    assert got["attention"][1] is None  # a blank sentence has no map
    expected = engine.attention_maps(sentences, SearchSettings(beam=2))
    for body, want in zip(got["attention"][::2], expected[::2], strict=True):
        assert (body["source_tokens"], body["target_tokens"]) == (want.source_tokens, want.target_tokens)
        weights = torch.tensor(body["weights"])  # (T, S), rounded to 4 decimals
        assert weights.shape == want.weights.shape and (weights - want.weights).abs().max() <= 1e-4
    assert "attention" not in post(url, {"sentences": sentences[:1]}).json()  # only when asked


def test_attention_and_plain_requests_at_once_each_get_their_own_kind(url: str, engine: Engine) -> None:
    """Requests with the same settings merge, but never a map request with a plain one."""
    bodies = [
        {"sentences": [s], "beam": 1, "attention": maps} for s in SENTENCES if s for maps in (True, False)
    ]

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT) as client:
            return await asyncio.gather(*(client.post("/translate", json=b) for b in bodies))

    for body, response in zip(bodies, asyncio.run(send_all()), strict=True):
        assert response.status_code == 200, response.text
        assert response.json()["translations"] == engine.translate(body["sentences"], SearchSettings(beam=1))
        assert ("attention" in response.json()) == body["attention"]


@pytest.mark.parametrize(
    ("extra", "mentions"),
    [
        pytest.param({"sentences": ["a"] * 5}, "5 sentences is over the limit of 4", id="too-many-maps"),
        pytest.param({"beam": 2, "nbest": 2}, "drop sample and nbest", id="with-nbest"),
        pytest.param({"sample": "topk:5"}, "drop sample and nbest", id="with-sample"),
    ],
)
def test_attention_beyond_its_bounds_is_422(url: str, extra: dict, mentions: str) -> None:
    response = post(url, {"sentences": ["Ein Hund."], "attention": True, **extra})
    assert response.status_code == 422, response.text
    assert mentions in response.json()["error"]


def test_an_engine_without_attention_weights_refuses_maps_and_says_so_in_health() -> None:
    with running_server(create_app(ScriptedEngine(), LIMITS)) as (base_url, _):
        response = post(base_url, {"sentences": ["a"], "attention": True})
        assert response.status_code == 422, response.text
        assert "the scripted engine has no attention weights" in response.json()["error"]
        assert httpx.get(f"{base_url}/health", timeout=TIMEOUT).json()["attention"] is False


def test_a_kernel_without_weights_refuses_maps_with_422_and_still_translates(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    path = tmp_path / "linear.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "linear"})
    with running_server(create_app(open_engine(path), LIMITS)) as (base_url, _):
        response = post(base_url, {"sentences": ["Ein Hund."], "beam": 1, "attention": True})
        assert response.status_code == 422, response.text
        assert "the torch engine has no attention weights" in response.json()["error"]
        assert httpx.get(f"{base_url}/health", timeout=TIMEOUT).json()["attention"] is False
        assert post(base_url, {"sentences": ["Ein Hund."], "beam": 1}).status_code == 200


def test_health_names_a_multilingual_models_target_languages(
    url: str, checkpoint_factory: Callable[..., torch.nn.Module], tmp_path: Path
) -> None:
    assert healthy(url)["target_languages"] == [] and healthy(url)["attention"] is True  # bilingual
    path = tmp_path / "multilingual.ckpt"
    directions = {"directions": ["en-de", "en-fr", "de-en"]}
    checkpoint_factory(
        path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"}, data_cfg=directions
    )
    with running_server(create_app(open_engine(path), LIMITS)) as (base_url, _):
        assert healthy(base_url)["target_languages"] == ["de", "en", "fr"]


def test_the_page_is_served_with_a_strict_content_security_policy(url: str) -> None:
    response = httpx.get(f"{url}/", timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert '<textarea id="source"' in response.text and "http" not in response.text.split("<script>")[1]
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy
    assert "/" not in httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json()["paths"]  # not JSON API
