"""The HTTP app: ``POST /translate`` and ``GET /health`` around one engine and its batcher, and ``GET /``
(a page for people, :mod:`app.serving.page`).

FastAPI binds the body to :class:`~app.serving.schema.TranslateRequest` (so ``/openapi.json`` and
``/docs`` describe it); :class:`~app.serving.guard.BodyGuard` vets the body before that (JSON only, size
limit). Every answer that is not a translation has one JSON shape, ``{"error", "detail"?,
"retry_after"?}``: 400 a bad combination of options, 408 a body sent too slowly, 413 too large (bytes,
sentences or work), 415 not JSON, 422 not the schema (the field named), 503 busy or past the deadline
(with ``Retry-After``), 500 an unexpected failure. The server goes on after each.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from app.data.multilingual import LanguageError, Languages
from app.inference.engine import AttentionMap, Engine, SearchSettings, Translation
from app.serving.batcher import Batcher, Results, Unavailable, token_cost
from app.serving.guard import BodyGuard
from app.serving.maps import attention_problem, map_body
from app.serving.page import install_page
from app.serving.schema import ErrorBody, Health, Hypothesis, TranslateRequest, TranslateResponse

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for, how requests are merged and queued, and how long they may take.

    Work is counted as (estimated subwords + 1 per sentence) x hypotheses per sentence (``beam`` rows
    for search, ``nbest`` samples when sampling): see :func:`~app.serving.batcher.token_cost`."""

    max_request_bytes: int = 64 * 1024
    max_sentences: int = 256
    max_request_tokens: int = 32768  # work one request may ask for
    max_batch_tokens: int = 8192  # work merged into one engine call (a larger request runs alone)
    max_wait_ms: float = 5.0  # how long the first request waits for others to join it
    batch_size: int = 64  # sentences per search batch inside the engine
    max_queued: int = 256  # requests waiting for the worker; more are answered 503
    request_timeout_s: float = 30.0  # deadline for receiving the body, and again for queue + decoding
    stuck_after_s: float = 60.0  # /health answers 503 when a request waited or a batch ran longer

    def __post_init__(self) -> None:
        for item in fields(self):
            if not getattr(self, item.name) > 0 and item.name != "max_wait_ms":
                raise ValueError(f"{item.name} must be > 0, got {getattr(self, item.name)}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class Refused(Exception):
    """A request the server will not run: answered with ``status`` and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error(status: int, message: str, detail: Any = None, retry_after: int | None = None) -> JSONResponse:
    """The one error shape (:class:`~app.serving.schema.ErrorBody`)."""
    body = ErrorBody(error=message, detail=detail, retry_after=retry_after).model_dump(exclude_none=True)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body, status_code=status, headers=headers)


def internal_error(err: BaseException, what: str) -> JSONResponse:
    """A 500 that tells the client nothing internal: ``err`` goes to the log under a fresh request id,
    which the answer gives (in its message and in ``X-Request-ID``) so that the two can be matched."""
    request_id = uuid.uuid4().hex[:16]
    log.error("%s (request id %s)", what, request_id, exc_info=err)
    response = error(500, f"internal error (request id {request_id}); the server goes on")
    response.headers["X-Request-ID"] = request_id
    return response


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": meaning}
    for status, meaning in {
        400: "empty body or an inconsistent combination of options (nbest > beam, bad sample spec), "
        "or a target_lang the model lacks (none for a multilingual model)",
        408: "the body was not received within the request timeout",
        413: "body, sentence count or work (tokens x hypotheses) over the server's limits",
        415: "Content-Type is not application/json",
        422: "not the schema: each wrong field named in detail; or attention maps this request may "
        "not have (too many sentences, an engine without weights)",
        500: "unexpected failure (the server goes on)",
        503: "queue full, deadline passed or shutting down; Retry-After says when to retry",
    }.items()
}


def answer(request: TranslateRequest, results: Results) -> TranslateResponse:
    """Best translations as strings, or (``nbest`` asked) lists of ``{"text", "score"}``, best first;
    asked with ``attention``, the strings and a map each (``results`` are the engine's maps then)."""
    if request.attention:
        maps = cast(list[AttentionMap | None], results)
        texts = ["" if m is None else m.translation for m in maps]
        return TranslateResponse(translations=texts, attention=[map_body(m) for m in maps])
    ranked = cast(list[list[Translation]], results)
    if not request.wants_scores:
        return TranslateResponse(translations=[hyps[0].text for hyps in ranked])
    return TranslateResponse(
        translations=[[Hypothesis(text=t.text, score=t.score) for t in hyps] for hyps in ranked]
    )


async def wait_for_disconnect(request: Request) -> None:
    """Return when the client hangs up (the body has been read already, so only that can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """The result of ``work``; if the client hangs up first, ``work`` is cancelled and :class:`ClientGone`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


def check_request(
    request: TranslateRequest, limits: ServerLimits, languages: Languages | None = None
) -> SearchSettings:
    """The search settings asked for; :class:`Refused` (400, 413) names what is wrong, including a
    ``target_lang`` the model lacks (or none for a multilingual model, unless each sentence starts with one
    of its tags), naming the model's languages."""
    if len(request.sentences) > limits.max_sentences:
        raise Refused(
            413, f"{len(request.sentences)} sentences is over the limit of {limits.max_sentences} per request"
        )
    if languages is not None:
        try:
            languages.tagged_sources(request.sentences, request.target_lang)
        except LanguageError as err:
            raise Refused(400, str(err)) from None
    try:
        settings = request.settings(limits.batch_size)
    except ValueError as err:
        raise Refused(400, str(err)) from None
    cost = token_cost(request.sentences, settings)
    if cost > limits.max_request_tokens:
        rows = f"nbest={request.nbest}" if request.sample else f"beam={request.beam}"
        raise Refused(
            413,
            f"the request costs {cost} (tokens + 1 per sentence, times {rows}), "
            f"over the limit of {limits.max_request_tokens}: send fewer sentences or hypotheses",
        )
    return settings


def field_name(problem: dict[str, Any]) -> str:
    """``sentences.1`` for a problem FastAPI locates at ``("body", "sentences", 1)``."""
    if problem["type"] == "json_invalid":  # located at a character offset, not a field
        return "(body)"
    return ".".join(map(str, problem["loc"][1:])) or "(body)"


def install_error_handlers(app: FastAPI) -> None:
    """Every error FastAPI or Starlette would answer in their own shapes, in ours."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        problems = err.errors()
        if any(p["type"] == "missing" and tuple(p["loc"]) == ("body",) for p in problems):
            return error(400, 'empty body; send JSON like {"sentences": ["Ein Satz."]}')
        detail = [{"field": field_name(p), "problem": p["msg"]} for p in problems]
        return error(422, "invalid request", detail)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        return error(err.status_code, str(err.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        return internal_error(err, "unexpected error answering a request")


def create_app(engine: Engine, limits: ServerLimits | None = None) -> FastAPI:
    """The service for ``engine``; its batcher lives as long as the app's event loop."""
    limits = limits or ServerLimits()
    state: dict[str, Batcher] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher = Batcher(
            engine,
            max_batch_tokens=limits.max_batch_tokens,
            max_wait_ms=limits.max_wait_ms,
            max_queued=limits.max_queued,
        )
        batcher.start()
        state["batcher"] = app.state.batcher = batcher
        yield
        await batcher.stop(grace_s=limits.request_timeout_s)

    app = FastAPI(title="attn-mt translation", lifespan=lifespan)
    app.add_middleware(BodyGuard, limit=limits.max_request_bytes, timeout_s=limits.request_timeout_s)
    install_error_handlers(app)
    install_page(app)

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health() -> JSONResponse:
        """The worker's state: 503 when it has stopped, is stuck, or the server is shutting down."""
        report = health_report(state["batcher"], engine.name, limits)
        report.target_languages, report.attention = target_languages(engine), engine.has_attention_maps
        return JSONResponse(report.model_dump(), status_code=200 if report.status == "ok" else 503)

    @app.post(
        "/translate",
        response_model=TranslateResponse,
        response_model_exclude_none=True,
        responses=ERROR_RESPONSES,
    )
    async def translate(body: TranslateRequest, http_request: Request) -> Any:
        """Translate ``sentences``; concurrent requests with the same options share engine calls."""
        try:
            settings = check_request(body, limits, getattr(engine, "languages", None))
        except Refused as err:
            return error(err.status, str(err))
        if problem := attention_problem(body, engine):
            return error(422, problem)
        work = state["batcher"].translate(
            body.sentences, settings, limits.request_timeout_s, attention=body.attention
        )
        try:
            results = await unless_disconnected(http_request, work)
        except Unavailable as err:
            return error(503, str(err), retry_after=err.retry_after)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        except Exception as err:  # the engine failed on this request alone (see Batcher.run_batch)
            if body.attention and isinstance(err, ValueError):  # a kernel without weights (linear)
                return error(422, f"attention: {err}")
            return internal_error(err, "translation failed")
        return answer(body, results)

    return app


def target_languages(engine: Engine) -> list[str]:
    """What ``target_lang`` may name: a multilingual model's targets, none for a bilingual one."""
    languages = engine.languages
    return languages.targets if languages is not None and languages.tagged else []


def health_report(batcher: Batcher, engine: str, limits: ServerLimits) -> Health:
    """Liveness of the worker task and how long the oldest request has waited."""
    oldest, running = batcher.oldest_queued_s(), batcher.running_s()
    if not batcher.alive:
        status = "dead"
    elif batcher.closing:
        status = "stopping"
    elif max(oldest, running) > limits.stuck_after_s:
        status = "stuck"
    else:
        status = "ok"
    return Health(
        status=status,
        engine=engine,
        queued=sum(not job.result.done() for job in batcher.pending),
        oldest_queued_s=round(oldest, 3),
        running_s=round(running, 3),
        batches_run=batcher.batches_run,
    )
