"""The HTTP app: ``POST /translate`` and ``GET /health`` around one engine and its batcher.

The body is read by hand, not by FastAPI's parameter binding, so that the size limit holds before any
JSON is parsed (also for chunked uploads without Content-Length) and every bad input gets one clear
4xx: 413 too large, 422 not the schema (the field is named), 400 a bad combination of options.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from app.inference.engines import Engine, Translation
from app.serving.batcher import Batcher
from app.serving.schema import TranslateRequest


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for, and how requests are merged."""

    max_request_bytes: int = 64 * 1024
    max_sentences: int = 256
    max_batch_tokens: int = 4096  # merged requests per engine call (whitespace tokens, see batcher)
    max_wait_ms: float = 5.0  # how long the first request waits for others to join it
    batch_size: int = 64  # sentences per search batch inside the engine

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_sentences", "max_batch_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class RequestError(Exception):
    """A bad request: answered with ``status`` and ``message``, the server goes on."""

    def __init__(self, status: int, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"error": self.message}
        if self.detail is not None:
            body["detail"] = self.detail
        return JSONResponse(body, status_code=self.status)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body of {declared} bytes is over the limit of {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"request body is over the limit of {limit} bytes")
    return bytes(body)


def parse_request(body: bytes, limits: ServerLimits) -> TranslateRequest:
    """The validated request; 400/413/422 for an empty, oversized or malformed one."""
    if not body.strip():
        raise RequestError(400, 'empty body; send JSON like {"sentences": ["Ein Satz."]}')
    try:
        request = TranslateRequest.model_validate_json(body)
    except ValidationError as err:
        detail = [
            {"field": ".".join(map(str, e["loc"])) or "(body)", "problem": e["msg"]}
            for e in err.errors(include_url=False, include_input=False)
        ]
        raise RequestError(422, "invalid request", detail) from None
    if len(request.sentences) > limits.max_sentences:
        raise RequestError(
            413, f"{len(request.sentences)} sentences is over the limit of {limits.max_sentences} per request"
        )
    return request


def answer(request: TranslateRequest, results: list[list[Translation]]) -> dict[str, Any]:
    """Best translations as strings, or (``nbest`` asked) lists of ``{"text", "score"}``, best first."""
    if not request.wants_scores:
        return {"translations": [hyps[0].text for hyps in results]}
    return {"translations": [[{"text": t.text, "score": t.score} for t in hyps] for hyps in results]}


def create_app(engine: Engine, limits: ServerLimits | None = None) -> FastAPI:
    """The service for ``engine``; its batcher lives as long as the app's event loop."""
    limits = limits or ServerLimits()
    state: dict[str, Batcher] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher = Batcher(engine, max_batch_tokens=limits.max_batch_tokens, max_wait_ms=limits.max_wait_ms)
        batcher.start()
        state["batcher"] = batcher
        yield
        await batcher.stop()

    app = FastAPI(title="attn-mt translation", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        batcher = state["batcher"]
        return {
            "status": "ok",
            "engine": engine.name,
            "queued": len(batcher.pending),
            "batches_run": batcher.batches_run,
        }

    @app.post("/translate")
    async def translate(http_request: Request) -> JSONResponse:
        try:
            request = parse_request(await read_body(http_request, limits.max_request_bytes), limits)
            try:
                settings = request.settings(limits.batch_size)
            except ValueError as err:
                raise RequestError(400, str(err)) from None
        except RequestError as err:
            return err.response()
        results = await state["batcher"].translate(request.sentences, settings)
        return JSONResponse(answer(request, results))

    return app
