"""A bounded load test on loopback: many concurrent clients, valid and hostile, against one real server.

Valid clients send 1-4 sentences at beam 1 or 2. Hostile ones send malformed JSON, oversized bodies
(declared or streamed), 64 samples of four sentences (over the work limit), a body not declared
JSON, a body dribbled in slowly, or a request they abandon at once. Every valid answer must equal
each sentence translated alone by the engine (merging into shared batches changes nothing), no
answer may be a 5xx, /health must stay 200 with the queue within its bound, and the process's memory
must stay bounded. Counts and time are bounded: a few seconds on two busy cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.server import JSON, running_server

from app.inference.engine import Engine, SearchSettings
from app.serving import ServerLimits, create_app

pytestmark = pytest.mark.usefixtures("single_torch_thread")

CLIENTS, ROUNDS = 32, 4  # 128 requests
BUDGET_S = 90.0  # the whole load, at most
RSS_GROWTH_MB = 150  # allowed growth of the process's resident memory under the load
LIMITS = ServerLimits(
    max_request_bytes=4096, max_sentences=6, max_request_tokens=1024, max_wait_ms=10.0, batch_size=8
)
HOSTILE = ["malformed", "oversized", "declared-oversized", "costly", "not-json", "slow", "vanishing"]
KINDS = ["valid"] * 6 + HOSTILE
Expected = dict[tuple[str, int], str]


@pytest.fixture(scope="module")
def url(engine: Engine) -> Iterator[str]:
    with running_server(create_app(engine, LIMITS)) as (base_url, _):
        yield base_url


def rss_mb() -> float:
    """This process's resident memory (the server runs in it), from /proc."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


async def raw_request(
    url: str, body: bytes, *, pause_s: float = 0.0, vanish: bool = False, length: int | None = None
) -> int | None:
    """POST ``body`` over a plain socket, in three pieces ``pause_s`` apart; the status (None if
    ``vanish``: the client hangs up right after sending). ``length`` declares another Content-Length."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length or len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        writer.write(head)
        third = len(body) // 3 + 1
        with contextlib.suppress(ConnectionError):  # the server may answer (413) before the body
            for start in range(0, len(body), third):
                writer.write(body[start : start + third])
                await writer.drain()
                await asyncio.sleep(pause_s)
        if vanish:
            return None
        status_line = await reader.readline()
        return int(status_line.split()[1])
    finally:
        writer.close()


async def one_request(client: httpx.AsyncClient, url: str, rng: random.Random, pool: list[str]) -> tuple:
    """One client action, picked by ``rng``: (kind, status, request body, answer or None)."""
    kind = rng.choice(KINDS)
    body = {"sentences": rng.sample(pool, rng.randint(1, min(4, len(pool)))), "beam": rng.choice([1, 2])}
    if kind == "valid":
        response = await client.post("/translate", json=body)
        return kind, response.status_code, body, response.json()
    if kind in ("slow", "vanishing"):
        pause_s, vanish = (0.05, False) if kind == "slow" else (0.0, True)
        status = await raw_request(url, json.dumps(body).encode(), pause_s=pause_s, vanish=vanish)
        return kind, status, body, None
    if kind == "declared-oversized":  # answered from the headers alone, the body never read
        return kind, await raw_request(url, b"", length=10**9), body, None
    content, headers = {
        "malformed": (b'{"sentences": ["unterbrochen', JSON),
        "oversized": (b'{"sentences": ["' + b"x" * 5000 + b'"]}', JSON),
        "not-json": (json.dumps(body).encode(), {"Content-Type": "text/plain"}),
        "costly": (json.dumps({"sentences": pool[:4], "sample": "topk:5", "nbest": 64}).encode(), JSON),
    }[kind]
    response = await client.post("/translate", content=content, headers=headers)
    return kind, response.status_code, body, None


async def load(url: str, pool: list[str]) -> tuple[list[tuple], list[httpx.Response]]:
    """Run every client to the end; meanwhile poll /health. Bounded by :data:`BUDGET_S`."""
    health: list[httpx.Response] = []
    limits = httpx.Limits(max_connections=CLIENTS + 2)
    async with httpx.AsyncClient(base_url=url, timeout=BUDGET_S, limits=limits) as client:

        async def user(index: int) -> list[tuple]:
            rng = random.Random(index)
            return [await one_request(client, url, rng, pool) for _ in range(ROUNDS)]

        async def monitor() -> None:
            while True:
                health.append(await client.get("/health"))
                await asyncio.sleep(0.1)

        watcher = asyncio.ensure_future(monitor())
        try:
            runs = await asyncio.wait_for(asyncio.gather(*(user(i) for i in range(CLIENTS))), BUDGET_S)
        finally:
            watcher.cancel()
    return [r for run in runs for r in run], health


def expected_alone(engine: Engine, pool: list[str]) -> Expected:
    """Each sentence translated on its own, at beam 1 and 2."""
    return {(s, b): engine.translate([s], SearchSettings(beam=b))[0] for s in pool for b in (1, 2)}


def test_many_clients_valid_and_hostile(
    url: str, engine: Engine, multi30k_slice: tuple[list[str], list[str]]
) -> None:
    pool = [s for s in multi30k_slice[0][:40] if len(s.split()) <= 12][:12]
    expected = expected_alone(engine, pool)
    asyncio.run(load(url, pool[:2]))  # warm up (allocator, first batches) before measuring memory
    before = rss_mb()
    results, health = asyncio.run(load(url, pool))
    growth = rss_mb() - before

    assert len(results) == CLIENTS * ROUNDS
    assert [r for r in results if r[1] is not None and r[1] >= 500] == []
    wanted = {"valid": {200}, "slow": {200}, "vanishing": {None}, "malformed": {422}, "not-json": {415}}
    for kind, status, body, answer in results:
        assert status in wanted.get(kind, {413}), (kind, status, body)
        if answer is not None:
            alone = [expected[(s, body["beam"])] for s in body["sentences"]]
            assert answer == {"translations": alone}, body
    assert {kind for kind, *_ in results} == set(KINDS)  # every kind of client took part
    assert health and all(h.status_code == 200 for h in health)
    assert max(h.json()["queued"] for h in health) <= LIMITS.max_queued
    assert growth < RSS_GROWTH_MB, f"resident memory grew by {growth:.0f} MB under load"
    translated = sum(kind in ("valid", "slow") for kind, *_ in results)
    batches = health[-1].json()["batches_run"] - health[0].json()["batches_run"]
    assert batches < translated  # concurrent requests shared engine calls
    print(f"{len(results)} requests, {translated} translated in {batches} engine calls, RSS +{growth:.0f} MB")
