"""Bounds on connections, below the app: how many may be open, how long a request head may take to
arrive, how long an idle connection is kept, how large a head may be.

uvicorn bounds part of this itself: ``limit_concurrency`` (503 once that many connections are open or
requests in flight), ``timeout_keep_alive`` (an idle connection after a response) and h11's
``max_incomplete_event_size`` (the bytes of a request head). It does not bound the time a request head
may take: a new connection has no timer until its first response is sent, so a socket that never sends
anything, or sends its headers a byte at a time, stays open for ever, holding a file descriptor.
:class:`BoundedH11Protocol` adds that deadline, and closes a connection that arrives when the limit is
already reached instead of keeping it open only to answer 503.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    """What uvicorn is told (see :meth:`uvicorn_options`); every value must be > 0."""

    max_connections: int = 512  # open at once; more are closed on arrival, requests at the limit get 503
    header_timeout_s: float = 10.0  # from connect (or the last response) to a complete request head
    keep_alive_s: float = 5.0  # an idle connection after a response is closed after this long
    max_header_bytes: int = 16 * 1024  # request line + headers; a larger head is answered 400

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
    """uvicorn's h11 protocol with a deadline for each request head and a hard cap on connections.

    The deadline starts when the connection is made and again when a response has been sent, and stops
    when a complete request head has arrived (the app's own deadlines, such as the body's 408, take over
    from there); when it passes, the connection is closed without an answer. Set by
    :func:`bounded_protocol`."""

    header_timeout_s: ClassVar[float] = ConnectionLimits.header_timeout_s

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_deadline: asyncio.TimerHandle | None = None

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
