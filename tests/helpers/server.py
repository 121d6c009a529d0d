"""A real uvicorn server on a loopback ephemeral port in a thread, and an engine a test can steer.

Every wait here is bounded by :data:`TIMEOUT`, so a broken server fails a test instead of hanging it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from app.inference.engine import Engine, SearchSettings, Translation

TIMEOUT = 60.0  # seconds
JSON = {"Content-Type": "application/json"}


@contextmanager
def running_server(app: FastAPI, **options: Any) -> Iterator[tuple[str, uvicorn.Server]]:
    """The base URL of ``app`` served on 127.0.0.1, and its server; stopped and joined on exit.

    ``options`` go to ``uvicorn.Config`` (``ConnectionLimits.uvicorn_options()``, as serve.py passes)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10, **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=TIMEOUT)
        sock.close()


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT, step: float = 0.02) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False


class ScriptedEngine(Engine):
    """An engine without a model: each sentence's translation is the sentence reversed.

    It records every call's sentences, blocks while ``gate`` is clear (a batch that takes as long as
    the test wants), fails a batch holding :attr:`POISON`, and answers nothing (an empty hypothesis
    list, which breaks the answer) for a sentence holding :attr:`HOLLOW`.
    """

    name = "scripted"
    max_source_tokens = 64
    POISON, HOLLOW = "POISON", "HOLLOW"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def translate_nbest(
        self,
        sentences: list[str],
        settings: SearchSettings,
        on_truncate: Callable[[int, int], None] | None = None,
        *,
        details: bool = False,
    ) -> list[list[Translation]]:
        self.calls.append(list(sentences))
        self.gate.wait(timeout=TIMEOUT)
        if any(self.POISON in s for s in sentences):
            raise RuntimeError("the engine cannot translate a poisoned sentence")
        return [
            [] if self.HOLLOW in s else [Translation(s[::-1], -1.0, [])] * settings.nbest for s in sentences
        ]

    def seen(self, word: str) -> bool:
        """Whether any engine call so far included a sentence containing ``word``."""
        return any(word in s for call in self.calls for s in call)


def post_translate(url: str, body: object, timeout: float = TIMEOUT) -> httpx.Response:
    return httpx.post(f"{url}/translate", json=body, timeout=timeout)
