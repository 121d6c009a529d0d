"""Bounds on connections, below the app: how many may be open, how long a request head may take to
arrive, how long an idle connection is kept, how large a head may be.

uvicorn bounds part of this itself: ``limit_concurrency`` (503 once that many connections are open or
requests in flight), ``timeout_keep_alive`` (an idle connection after a response) and h11's
``max_incomplete_event_size`` (the bytes of a request head). It does not bound the time a request head
may take: a new connection has no timer until its first response is sent, so a socket that never sends
anything, or sends its headers a byte at a time, stays open for ever, holding a file descriptor. And h11
checks a head's size only while the head is incomplete, so one that arrives in a single read (asyncio
reads up to 256 KiB) passes whatever its size. :class:`BoundedH11Protocol` adds the deadline, counts
each head's bytes as they arrive, and closes a connection that arrives when the limit is already
reached instead of keeping it open only to answer 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
BLANK_LINE = re.compile(rb"\n\r?\n")  # the end of a request head, as h11 finds it


@dataclass(frozen=True)
class ConnectionLimits:
    """What uvicorn is told (see :meth:`uvicorn_options`); every value must be > 0."""

    max_connections: int = 512  # open at once; more are closed on arrival, requests at the limit get 503
    header_timeout_s: float = 10.0  # from connect (or the last response) to a complete request head
    keep_alive_s: float = 5.0  # an idle connection after a response is closed after this long
    max_header_bytes: int = 16 * 1024  # request line + headers; a larger head is answered 431

    def __post_init__(self) -> None:
        for item in fields(self):
            if not getattr(self, item.name) > 0:
                raise ValueError(f"{item.name} must be > 0, got {getattr(self, item.name)}")

    def uvicorn_options(self) -> dict[str, Any]:
        """Keyword arguments for ``uvicorn.Config`` (or ``uvicorn.run``) that enforce these limits."""
        return {
            "http": bounded_protocol(self.header_timeout_s),
            "ws": "none",  # no WebSocket routes: an upgrade would leave the header deadline's reach
            "limit_concurrency": self.max_connections,
            "timeout_keep_alive": self.keep_alive_s,
            "h11_max_incomplete_event_size": self.max_header_bytes,
        }


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline and a size limit for each request head, and a hard cap on
    connections.

    The deadline starts when the connection is made and again when a response has been sent, and stops
    when a complete request head has arrived (the app's own deadlines, such as the body's 408, take over
    from there); when it passes, the connection is closed without an answer. While it runs, the bytes
    received are counted up to the head's blank line; past uvicorn's ``h11_max_incomplete_event_size``
    the answer is 431 and the connection is closed. The deadline is set by :func:`bounded_protocol`."""

    header_timeout_s: ClassVar[float] = ConnectionLimits.header_timeout_s

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_deadline: asyncio.TimerHandle | None = None
        self.head_bytes, self.head_tail = 0, b""  # of the head being received; its last two bytes
        self.max_header_bytes = self.config.h11_max_incomplete_event_size or ConnectionLimits.max_header_bytes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.limit_concurrency is not None and len(self.connections) >= self.limit_concurrency:
            log.warning("closed a new connection: %d are open, the limit", len(self.connections))
            transport.close()  # left unregistered: connection_lost below ignores it
            return
        super().connection_made(transport)
        self.expect_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_head_deadline()
        if self.transport is not None:  # None: refused in connection_made
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        waiting = self.head_deadline is not None and self.conn.their_state is h11.IDLE
        if waiting and self.head_too_large(data):
            self.refuse_head()
            return
        super().data_received(data)

    def head_too_large(self, data: bytes) -> bool:
        """Count ``data`` into the head being received: whether it has passed ``max_header_bytes``."""
        seen = self.head_tail + data
        end = BLANK_LINE.search(seen)
        size = self.head_bytes + (end.end() - len(self.head_tail) if end else len(data))
        self.head_bytes, self.head_tail = self.head_bytes + len(data), seen[-2:]
        return size > self.max_header_bytes

    def refuse_head(self) -> None:
        """Answer 431 in the service's JSON shape (h11 cannot: no request has begun) and close."""
        body = json.dumps({"error": f"request head over the limit of {self.max_header_bytes} bytes"}).encode()
        head = "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        self.transport.write(
            f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body
        )
        self.stop_head_deadline()
        self.transport.close()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request head arrived (each one starts a new cycle)
            self.stop_head_deadline()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self.expect_head()  # before uvicorn unblocks a pipelined request, which stops it again
        super().on_response_complete()

    def expect_head(self) -> None:
        """(Re)start the clock for the next request head."""
        self.stop_head_deadline()
        self.head_bytes, self.head_tail = 0, b""
        self.head_deadline = self.loop.call_later(self.header_timeout_s, self.head_timed_out)

    def stop_head_deadline(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def head_timed_out(self) -> None:
        self.head_deadline = None
        if not self.transport.is_closing():
            log.debug("closed a connection: no request head within %g s", self.header_timeout_s)
            self.transport.close()


def bounded_protocol(header_timeout_s: float) -> type[BoundedH11Protocol]:
    """:class:`BoundedH11Protocol` with this header deadline (uvicorn builds protocols from a class)."""
    if not header_timeout_s > 0:
        raise ValueError(f"header_timeout_s must be > 0, got {header_timeout_s}")
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"header_timeout_s": header_timeout_s})
