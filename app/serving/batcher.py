"""Merge concurrent translation requests into shared engine calls.

Requests arrive as :class:`Job` s on one asyncio loop. A background task takes the oldest job, waits a
few milliseconds for company, then adds every queued job with *identical* search settings (in arrival
order) while the batch stays within a token budget, and runs the whole batch on a single worker thread:
the model is used by one thread at a time and the event loop never blocks. Each job gets its own slice
of the results back, in its own order. Greedy and beam outputs do not depend on batch company (the
engines are batch invariant), so merging changes speed only. Sampling jobs run alone: their seeded draws
would otherwise depend on who else was in the batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from app.inference.engines import Engine, Translation
from app.inference.translator import SearchSettings

log = logging.getLogger(__name__)
Results = list[list[Translation]]


def token_cost(sentences: list[str]) -> int:
    """What a job costs against the budget: whitespace tokens plus one (EOS) per sentence.

    An engine-independent stand-in for subwords, cheap enough to compute on the event loop."""
    return sum(len(s.split()) + 1 for s in sentences)


@dataclass
class Job:
    sentences: list[str]
    settings: SearchSettings
    result: asyncio.Future[Results]
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = token_cost(self.sentences)

    def mergeable_with(self, other: Job) -> bool:
        return self.settings.sampling is None and self.settings == other.settings


class Batcher:
    """Queue of jobs and the task that runs them; ``start`` and ``stop`` on the serving loop."""

    def __init__(self, engine: Engine, *, max_batch_tokens: int = 4096, max_wait_ms: float = 5.0) -> None:
        if max_batch_tokens < 1 or max_wait_ms < 0:
            raise ValueError(
                f"max_batch_tokens must be >= 1 (got {max_batch_tokens}) and max_wait_ms >= 0 "
                f"(got {max_wait_ms})"
            )
        self.engine = engine
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_ms / 1000
        self.pending: deque[Job] = deque()
        self.arrived = asyncio.Event()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="translate")
        self.task: asyncio.Task[None] | None = None
        self.batches_run = 0  # engine calls made; merged requests make fewer

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(), name="batcher")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        for job in self.pending:
            job.result.cancel()
        self.worker.shutdown(wait=True)

    async def translate(self, sentences: list[str], settings: SearchSettings) -> Results:
        """Queue ``sentences`` and wait for their translations (cancelled if the caller goes away)."""
        job = Job(sentences, settings, asyncio.get_running_loop().create_future())
        self.pending.append(job)
        self.arrived.set()
        return await job.result

    async def run(self) -> None:
        while True:
            await self.arrived.wait()
            if self.max_wait_s:
                await asyncio.sleep(self.max_wait_s)  # let concurrent requests join the first one
            batch = self.take_batch()
            if not self.pending:
                self.arrived.clear()
            if batch:
                await self.run_batch(batch)

    def take_batch(self) -> list[Job]:
        """The oldest live job plus every queued job it can merge with, within the token budget."""
        while self.pending and self.pending[0].result.done():  # the client gave up
            self.pending.popleft()
        if not self.pending:
            return []
        head = self.pending.popleft()
        batch, tokens, kept = [head], head.tokens, deque()
        while self.pending:
            job = self.pending.popleft()
            if job.result.done():
                continue
            if head.mergeable_with(job) and tokens + job.tokens <= self.max_batch_tokens:
                batch.append(job)
                tokens += job.tokens
            else:
                kept.append(job)
        self.pending = kept
        return batch

    async def run_batch(self, batch: list[Job]) -> None:
        sentences = [s for job in batch for s in job.sentences]
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                self.worker, self.engine.translate_nbest, sentences, batch[0].settings
            )
        except Exception as err:  # reported to every waiting client, the server goes on
            log.exception("translation failed for a batch of %d sentences", len(sentences))
            for job in batch:
                if not job.result.done():
                    job.result.set_exception(err)
            return
        self.batches_run += 1
        start = 0
        for job in batch:
            part = results[start : start + len(job.sentences)]
            start += len(job.sentences)
            if not job.result.done():
                job.result.set_result(part)
