"""The batcher alone, on its own event loop: costs, stopping, and failures kept to their request."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers.server import ScriptedEngine

from app.decoding import Sampling
from app.inference.engine import SearchSettings
from app.serving.batcher import Batcher, Unavailable, token_cost

GREEDY = SearchSettings(beam=1)


def test_the_cost_counts_every_hypothesis_decoded() -> None:
    sentences = ["zwei Wörter", "drei Wörter hier"]  # 7 subwords (a 6-letter word is 2) + 2 EOS
    assert token_cost(sentences) == 9
    assert token_cost(sentences, SearchSettings(beam=4)) == 36
    sampled = SearchSettings(beam=1, nbest=50, sampling=Sampling(top_k=5))
    assert token_cost(sentences, sampled) == 450


def test_the_cost_counts_characters_so_a_long_word_is_not_one_token() -> None:
    assert token_cost(["a" * 1000]) == 251  # one whitespace token, 250 subwords + EOS
    assert token_cost(["ein " * 250]) == 251  # the same characters as short words cost the same
    assert token_cost(["x" * 1001, "   "], SearchSettings(beam=5)) == (252 + 1) * 5


def test_stop_answers_the_running_batch_without_blocking_the_loop() -> None:
    engine = ScriptedEngine()
    engine.gate.clear()

    async def scenario() -> tuple[int, list]:
        batcher = Batcher(engine, max_wait_ms=0)
        batcher.start()
        job = asyncio.ensure_future(batcher.translate(["im Flug"], GREEDY, timeout_s=30))
        while not engine.calls:
            await asyncio.sleep(0.01)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        release = threading.Timer(0.5, engine.gate.set)
        release.start()
        await asyncio.wait_for(batcher.stop(grace_s=10), 20)
        ticker.cancel()
        return ticks, await asyncio.wait_for(job, 1)

    try:
        ticks, results = asyncio.run(scenario())
    finally:
        engine.gate.set()
    assert ticks >= 10  # the loop ran while the batch finished (a blocking stop gives 1 or 2)
    assert [[t.text for t in hyps] for hyps in results] == [["gulF mi"]]


def test_after_stop_new_requests_are_refused() -> None:
    async def scenario() -> None:
        batcher = Batcher(ScriptedEngine(), max_wait_ms=0)
        batcher.start()
        await batcher.stop(grace_s=1)
        with pytest.raises(Unavailable, match="shutting down"):
            await batcher.translate(["zu spät"], GREEDY, timeout_s=1)

    asyncio.run(scenario())
