"""What the server bounds below its routes, for real: uvicorn on a loopback port with serve.py's
connection options (timeouts of a second, so the tests wait little), a tiny torch engine, raw sockets.

Idle sockets and a client sending its headers a byte at a time are closed within the header timeout
while ``/translate`` goes on answering; connections past the limit are closed on arrival; a request
framed twice (Content-Length and Transfer-Encoding) is 400 and its connection closed; a 500 names a
request id and keeps the exception for the log; an over-long word costs what its characters say.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
import uvicorn
from helpers.models import TINY_TRANSFORMER
from helpers.server import TIMEOUT, post_translate, running_server, wait_until

from app.inference.engine import Engine
from app.inference.engines import open_engine
from app.serving import ServerLimits, create_app
from app.serving.connections import ConnectionLimits

pytestmark = pytest.mark.usefixtures("single_torch_thread")

HEADER_TIMEOUT, KEEP_ALIVE = 1.0, 0.5  # seconds
SLACK = 1.5  # seconds a loaded two-core machine may add to a timer
CONNECTIONS = ConnectionLimits(max_connections=400, header_timeout_s=HEADER_TIMEOUT, keep_alive_s=KEEP_ALIVE)
LIMITS = ServerLimits(max_request_tokens=600, max_wait_ms=0.0)
IDLE = 250  # idle sockets opened at once
HELLO = {"sentences": ["Ein Hund läuft."], "beam": 1, "max_len": 8}


@pytest.fixture(scope="module")
def served(engine: Engine) -> Iterator[tuple[str, uvicorn.Server]]:
    """One server for the module, started as serve.py starts it (its connection options)."""
    with running_server(create_app(engine, LIMITS), **CONNECTIONS.uvicorn_options()) as started:
        yield started


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def open_connections(url: str, count: int) -> list[socket.socket]:
    return [socket.create_connection(address(url), timeout=TIMEOUT) for _ in range(count)]


def open_count(server: uvicorn.Server) -> int:
    return len(server.server_state.connections)


def closing_times(sockets: list[socket.socket], timeout: float) -> list[float | None]:
    """When (``time.monotonic()``) the server closed each socket, None for those still open after
    ``timeout`` seconds; anything the server sends first is read and ignored."""
    closed: list[float | None] = [None] * len(sockets)
    with selectors.DefaultSelector() as selector:
        for index, sock in enumerate(sockets):
            selector.register(sock, selectors.EVENT_READ, index)
        deadline = time.monotonic() + timeout
        while selector.get_map() and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
                try:
                    ended = key.fileobj.recv(4096) == b""  # type: ignore[union-attr]
                except ConnectionResetError:
                    ended = True
                if ended:
                    closed[key.data] = time.monotonic()
                    selector.unregister(key.fileobj)
    return closed


def send_slowly(url: str, data: bytes, every_s: float) -> tuple[int, float]:
    """Send ``data`` a byte every ``every_s`` seconds until the server closes the connection: how many
    bytes went out and how long it took (the whole ``data`` and ``TIMEOUT`` if it was never closed)."""
    start = time.monotonic()
    with socket.create_connection(address(url), timeout=TIMEOUT) as sock:
        for sent, byte in enumerate(data):
            if closing_times([sock], every_s)[0] is not None:
                return sent, time.monotonic() - start
            sock.sendall(bytes([byte]))
    return len(data), TIMEOUT


def request_head(url: str, body: bytes, extra: str = "") -> bytes:
    host, port = address(url)
    head = f"POST /translate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n{extra}\r\n".encode()


def test_idle_and_slow_connections_are_closed_while_requests_are_answered(
    served: tuple[str, uvicorn.Server],
) -> None:
    url, server = served
    expected = post_translate(url, HELLO).json()
    assert wait_until(lambda: open_count(server) == 0, timeout=SLACK)
    body = b'{"sentences": ["langsam"]}'
    answered, peak = [], 0
    with ThreadPoolExecutor(max_workers=2) as pool, httpx.Client(timeout=TIMEOUT) as client:
        slow = pool.submit(send_slowly, url, request_head(url, body) + body, 0.5)
        begin = time.monotonic()
        idle = open_connections(url, IDLE)
        watch = pool.submit(closing_times, idle, HEADER_TIMEOUT + SLACK)
        while not watch.done():  # normal requests go on meanwhile
            peak = max(peak, open_count(server))
            response = client.post(f"{url}/translate", json=HELLO)
            answered.append((response.status_code, response.json()))
        closed, (sent, slow_for) = watch.result(), slow.result(TIMEOUT)
    for sock in idle:
        sock.close()
    assert all(when is not None for when in closed), f"{closed.count(None)} of {IDLE} idle sockets still open"
    assert min(closed) - begin >= HEADER_TIMEOUT * 0.9, "closed before the header timeout"  # type: ignore[operator]
    assert max(closed) - begin <= HEADER_TIMEOUT + SLACK  # type: ignore[operator]
    assert HEADER_TIMEOUT * 0.9 <= slow_for <= HEADER_TIMEOUT + SLACK
    assert sent <= 4  # of a request head of ~110 bytes, at 2 bytes a second
    assert peak >= IDLE + 1, "the idle sockets were never all open on the server"
    assert len(answered) >= 2 and set(map(str, answered)) == {str((200, expected))}
    assert wait_until(lambda: open_count(server) == 0, timeout=SLACK)


def test_a_request_head_stops_the_clock_and_an_idle_connection_ends_after_keep_alive(
    served: tuple[str, uvicorn.Server],
) -> None:
    url, _ = served
    body = b'{"sentences": ["Ein Hund."], "beam": 1, "max_len": 4}'
    with socket.create_connection(address(url), timeout=TIMEOUT) as sock:
        sock.sendall(request_head(url, body))
        time.sleep(HEADER_TIMEOUT + 0.2)  # the body arrives after the header timeout: it is not a head
        sock.sendall(body)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
        answered = time.monotonic()
        assert (when := closing_times([sock], HEADER_TIMEOUT + SLACK)[0]) is not None
        assert KEEP_ALIVE * 0.9 <= when - answered <= KEEP_ALIVE + SLACK


def test_connections_past_the_limit_are_closed_on_arrival(engine: Engine) -> None:
    limits = ConnectionLimits(max_connections=8, header_timeout_s=TIMEOUT)
    with running_server(create_app(engine, LIMITS), **limits.uvicorn_options()) as (url, server):
        held = open_connections(url, 8)
        assert wait_until(lambda: open_count(server) == 8, timeout=SLACK)
        extra = open_connections(url, 4)
        closed = closing_times(extra, timeout=SLACK)
        assert all(when is not None for when in closed) and open_count(server) == 8
        for sock in held + extra:
            sock.close()
        assert wait_until(lambda: open_count(server) == 0, timeout=SLACK)
        assert post_translate(url, HELLO).status_code == 200


def test_content_length_with_transfer_encoding_is_400_and_closed(served: tuple[str, uvicorn.Server]) -> None:
    url, _ = served
    chunked = b'1a\r\n{"sentences": ["zweimal"]}\r\n0\r\n\r\n'
    smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"  # what a proxy reading Content-Length sees next
    head = request_head(url, b"x" * 5, extra="Transfer-Encoding: chunked\r\n")
    with socket.create_connection(address(url), timeout=TIMEOUT) as sock:
        sock.sendall(head + chunked + smuggled)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in answer.lower() and b"Content-Length and Transfer-Encoding" in answer
    assert answer.count(b"HTTP/1.1") == 1  # the request behind it was not answered
    assert post_translate(url, HELLO).status_code == 200


def read_until_closed(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer


@pytest.mark.parametrize("pieces", [1, 3])
def test_a_head_over_the_size_limit_is_431_and_closed(
    served: tuple[str, uvicorn.Server], pieces: int
) -> None:
    url, _ = served
    padding = "p" * (CONNECTIONS.max_header_bytes - 100)  # the head a few bytes over, the body not sent
    head = request_head(url, b"{}", extra=f"X-Padding: {padding}\r\n")
    with socket.create_connection(address(url), timeout=TIMEOUT) as sock:
        part = -(-len(head) // pieces)  # whole (as h11 alone let through) or in parts
        for start in range(0, len(head), part):
            sock.sendall(head[start : start + part])
            time.sleep(0.01)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 431 ") and b"over the limit of 16384 bytes" in answer
    fits = request_head(url, b"{}", extra=f"X-Padding: {padding[:-200]}\r\n") + b"{}"
    with socket.create_connection(address(url), timeout=TIMEOUT) as sock:
        sock.sendall(fits)
        assert sock.recv(4096).startswith(b"HTTP/1.1 422 ")  # parsed: {} lacks "sentences"


def test_an_over_long_word_costs_its_characters(served: tuple[str, uvicorn.Server]) -> None:
    url, _ = served
    response = post_translate(url, {"sentences": ["a" * 1000], "beam": 3})  # 251 x 3 over 600
    assert response.status_code == 413
    assert "costs 753" in response.json()["error"] and "limit of 600" in response.json()["error"]
    assert post_translate(url, {"sentences": ["a" * 1000], "beam": 1, "max_len": 4}).status_code == 200


@pytest.fixture(scope="module")
def weightless_engine(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Engine:
    """The real torch engine with its weights released (each parameter emptied, as a server that let
    go of its model's memory would leave it).

    Every input the server accepts is valid, so no request trips a genuine bug; this breaks the real
    engine instead of standing in for it: the failure is torch's own (``'weight' must be 2-D``), raised
    inside decoding, and batcher, retry and app run as in production. Nothing of ours is replaced."""
    path: Path = tmp_path_factory.mktemp("weightless") / "model.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    engine = open_engine(path)
    with torch.no_grad():
        for param in engine.model.parameters():  # type: ignore[attr-defined]
            param.data = param.data.new_empty(0)
    return engine


def test_a_500_names_a_request_id_and_keeps_the_details_for_the_log(
    weightless_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(weightless_engine, LIMITS)
    with caplog.at_level(logging.ERROR, logger="app.serving.api"), running_server(app) as (url, _):
        first, second = (post_translate(url, HELLO) for _ in range(2))
    assert [first.status_code, second.status_code] == [500, 500]
    request_id = first.headers["x-request-id"]
    assert first.json() == {"error": f"internal error (request id {request_id}); the server goes on"}
    assert second.headers["x-request-id"] != request_id
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    detail = str(logged[0].exc_info[1])
    assert detail and detail not in first.text and logged[0].exc_info[0].__name__ not in first.text
