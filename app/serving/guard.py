"""An ASGI middleware that vets a POST body before the app sees it.

Runs before FastAPI parses anything, so that: a body that is not declared JSON is refused with 415 (a
web page can POST ``text/plain``, a form or an untyped blob to a loopback server without a CORS
preflight, but not ``application/json``); a body over the size limit is refused with 413 as soon as it
passes the limit (also for chunked uploads without Content-Length), never buffered whole; a client that
sends its body too slowly gets 408; a request that declares both Content-Length and Transfer-Encoding (two
framings, the shape of request smuggling: RFC 9112 section 6.3) gets 400 and its connection is closed,
whatever its method. The vetted body is then replayed to the app, and later ``receive``
calls reach the server again, so the app still hears when the client disconnects.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
JSON_TYPES = ("application/json",)


class TooLarge(Exception):
    """The body passed the limit while it was read."""


def content_type(scope: Scope) -> str:
    """The media type of the request, lower case, without parameters (``charset``)."""
    for name, value in scope.get("headers", []):
        if name == b"content-type":
            return value.decode("latin-1").split(";")[0].strip().lower()
    return ""


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


def framed_twice(scope: Scope) -> bool:
    """Whether the request declares both a Content-Length and a Transfer-Encoding."""
    names = {name for name, _ in scope.get("headers", [])}
    return b"content-length" in names and b"transfer-encoding" in names


async def send_error(send: Any, status: int, message: str, close: bool = False) -> None:
    """Answer with the service's JSON error shape (see ``schema.ErrorBody``); ``close`` ends the
    connection after it (``Connection: close``, which uvicorn honours)."""
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_limited(receive: Any, limit: int) -> bytes | None:
    """The whole body; None if the client disconnected; :class:`TooLarge` past ``limit`` bytes."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit:
            raise TooLarge
        if not message.get("more_body", False):
            return bytes(body)


class BodyGuard:
    """Vet the body of every POST to ``app``: JSON only, at most ``limit`` bytes, within ``timeout_s``."""

    def __init__(self, app: Any, *, limit: int, timeout_s: float) -> None:
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and framed_twice(scope):  # the body is left unread
            message = "the request has both Content-Length and Transfer-Encoding; send one of them"
            await send_error(send, 400, message, close=True)
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if content_type(scope) not in JSON_TYPES:
            found = content_type(scope) or "none"
            await send_error(send, 415, f"Content-Type must be application/json, got {found}")
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.limit:
            await send_error(send, 413, f"request body of {declared} bytes is over the limit of {self.limit}")
            return
        try:
            body = await asyncio.wait_for(read_limited(receive, self.limit), self.timeout_s)
        except TooLarge:
            await send_error(send, 413, f"request body is over the limit of {self.limit} bytes")
            return
        except asyncio.TimeoutError:
            await send_error(send, 408, f"request body not received within {self.timeout_s:g} s")
            return
        if body is None:  # the client went away while sending
            return
        await self.app(scope, replay(body, receive), send)


def replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` once, then hands over to the server's ``receive``."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
