"""The server under trouble: a full queue, deadlines, clients that vanish, a failing or stuck engine.

A :class:`~helpers.server.ScriptedEngine` (no model) lets each test hold a batch open as long as it
wants and see exactly which sentences reached the engine. Each test runs its own server.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from helpers.server import TIMEOUT, ScriptedEngine, post_translate, running_server, wait_until

from app.serving import ServerLimits, create_app

FAST = {"max_wait_ms": 0.0}


@pytest.fixture
def engine() -> Iterator[ScriptedEngine]:
    engine = ScriptedEngine()
    yield engine
    engine.gate.set()  # never leave a worker thread waiting


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        yield pool


def health(url: str) -> httpx.Response:
    return httpx.get(f"{url}/health", timeout=TIMEOUT)


def hold_first_batch(url: str, engine: ScriptedEngine, pool: ThreadPoolExecutor) -> Future:
    """Send one request and return once the engine is busy (blocked) translating it."""
    engine.gate.clear()
    first = pool.submit(post_translate, url, {"sentences": ["erste Anfrage"], "beam": 1})
    assert wait_until(lambda: bool(engine.calls)), "the first request never reached the engine"
    return first


def test_an_abandoned_request_never_reaches_the_engine(
    engine: ScriptedEngine, pool: ThreadPoolExecutor
) -> None:
    with running_server(create_app(engine, ServerLimits(**FAST))) as (url, _):
        first = hold_first_batch(url, engine, pool)
        host, port = url.removeprefix("http://").split(":")
        body = b'{"sentences": ["ABANDONED sentence"], "beam": 1}'
        head = f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as conn:
            conn.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert wait_until(lambda: health(url).json()["queued"] == 1)
        wait_until(lambda: health(url).json()["queued"] == 0, timeout=5)  # the hang-up is noticed
        engine.gate.set()
        assert first.result(TIMEOUT).status_code == 200
        after = post_translate(url, {"sentences": ["danach"], "beam": 1})
        assert after.json() == {"translations": ["hcanad"]}
        assert not engine.seen("ABANDONED")


def test_a_failing_request_fails_alone_when_merged(engine: ScriptedEngine, pool: ThreadPoolExecutor) -> None:
    with running_server(create_app(engine, ServerLimits(**FAST))) as (url, _):
        first = hold_first_batch(url, engine, pool)  # the next four queue up and are merged
        bodies = [{"sentences": [f"gut {i}", "auch gut"], "beam": 1} for i in range(3)]
        bodies.insert(1, {"sentences": ["a POISON sentence"], "beam": 1})
        futures = [pool.submit(post_translate, url, b) for b in bodies]
        assert wait_until(lambda: health(url).json()["queued"] == 4)
        engine.gate.set()
        responses = [f.result(TIMEOUT) for f in futures]
        assert first.result(TIMEOUT).status_code == 200
    assert len(engine.calls[1]) == 7  # all four were merged into one engine call, which failed
    assert [r.status_code for r in responses] == [200, 500, 200, 200]
    assert responses[0].json() == {"translations": ["0 tug", "tug hcua"]}
    assert responses[1].headers["content-type"] == "application/json"
    assert responses[1].json()["error"].startswith("internal error (request id ")
    assert "RuntimeError" not in responses[1].text  # the details are for the log


def test_an_unexpected_error_is_a_json_500_and_the_server_goes_on(engine: ScriptedEngine) -> None:
    with running_server(create_app(engine, ServerLimits(**FAST))) as (url, _):
        response = post_translate(url, {"sentences": ["HOLLOW"], "beam": 1})
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/json"
        request_id = response.headers["x-request-id"]
        assert response.json()["error"] == f"internal error (request id {request_id}); the server goes on"
        assert post_translate(url, {"sentences": ["ok"], "beam": 1}).json() == {"translations": ["ko"]}


def test_a_full_queue_is_503_with_retry_after(engine: ScriptedEngine, pool: ThreadPoolExecutor) -> None:
    with running_server(create_app(engine, ServerLimits(max_queued=1, **FAST))) as (url, _):
        first = hold_first_batch(url, engine, pool)
        queued = pool.submit(post_translate, url, {"sentences": ["zweite"], "beam": 1})
        assert wait_until(lambda: health(url).json()["queued"] == 1)
        refused = post_translate(url, {"sentences": ["dritte"], "beam": 1})
        assert refused.status_code == 503
        assert int(refused.headers["retry-after"]) >= 1
        assert "limit is 1" in refused.json()["error"]
        assert refused.json()["retry_after"] == int(refused.headers["retry-after"])
        engine.gate.set()
        assert [first.result(TIMEOUT).status_code, queued.result(TIMEOUT).status_code] == [200, 200]
    assert not engine.seen("dritte")


def test_a_request_past_its_deadline_is_503_and_never_decoded(
    engine: ScriptedEngine, pool: ThreadPoolExecutor
) -> None:
    with running_server(create_app(engine, ServerLimits(request_timeout_s=0.5, **FAST))) as (url, _):
        first = hold_first_batch(url, engine, pool)
        late = post_translate(url, {"sentences": ["LATE request"], "beam": 1})
        assert late.status_code == 503
        assert "deadline of 0.5 s" in late.json()["error"]
        assert "retry-after" in late.headers
        assert first.result(TIMEOUT).status_code == 503  # the held batch passed its deadline too
        engine.gate.set()
        assert post_translate(url, {"sentences": ["ok"], "beam": 1}).status_code == 200
    assert not engine.seen("LATE")


def test_health_reports_a_stuck_worker_and_the_oldest_wait(
    engine: ScriptedEngine, pool: ThreadPoolExecutor
) -> None:
    with running_server(create_app(engine, ServerLimits(stuck_after_s=0.3, **FAST))) as (url, _):
        assert health(url).json()["status"] == "ok"
        first = hold_first_batch(url, engine, pool)
        queued = pool.submit(post_translate, url, {"sentences": ["zweite"], "beam": 1})
        assert wait_until(lambda: health(url).status_code == 503)
        report = health(url).json()
        assert report["status"] == "stuck"
        assert report["running_s"] > 0.3
        assert report["queued"] == 1 and report["oldest_queued_s"] > 0
        engine.gate.set()
        assert [first.result(TIMEOUT).status_code, queued.result(TIMEOUT).status_code] == [200, 200]
        assert health(url).json()["status"] == "ok"


def test_health_reports_a_dead_worker_and_requests_get_503(engine: ScriptedEngine) -> None:
    app = create_app(engine, ServerLimits(**FAST))
    with running_server(app) as (url, _):
        task = app.state.batcher.task
        task.get_loop().call_soon_threadsafe(task.cancel)
        assert wait_until(lambda: health(url).status_code == 503)
        assert health(url).json()["status"] == "dead"
        response = post_translate(url, {"sentences": ["ok"], "beam": 1})
        assert response.status_code == 503
        assert "worker has stopped" in response.json()["error"]


def test_shutdown_answers_the_request_in_flight(engine: ScriptedEngine, pool: ThreadPoolExecutor) -> None:
    with running_server(create_app(engine, ServerLimits(**FAST))) as (url, server):
        first = hold_first_batch(url, engine, pool)
        server.should_exit = True
        pool.submit(lambda: wait_until(lambda: False, timeout=0.3) or engine.gate.set())
        response = first.result(TIMEOUT)
    assert response.status_code == 200
    assert response.json() == {"translations": ["egarfnA etsre"]}


def test_a_body_sent_too_slowly_is_408(engine: ScriptedEngine) -> None:
    with running_server(create_app(engine, ServerLimits(request_timeout_s=0.5, **FAST))) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        head = (
            f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n"
        )
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as conn:
            conn.sendall(head.encode() + b'{"sentences": ')  # and then nothing more
            answer = b""
            while b"}" not in answer:  # the status line, the headers and the JSON error
                chunk = conn.recv(4096)
                assert chunk, f"connection closed before the whole answer: {answer!r}"
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"not received within 0.5 s" in answer
        assert post_translate(url, {"sentences": ["ok"], "beam": 1}).status_code == 200
