"""Merge concurrent translation requests into shared engine calls, within bounds.

Requests arrive as :class:`Job` s on one asyncio loop. A background task takes the oldest job, waits a
few milliseconds for company, then adds every queued job with *identical* search settings (in arrival
order) while the batch stays within a cost budget, and runs the whole batch on a single worker thread:
the model is used by one thread at a time and the event loop never blocks. Each job gets its own slice
of the results back, in its own order. Greedy and beam outputs do not depend on batch company (the
engines are batch invariant), so merging changes speed only. Sampling jobs run alone: their seeded draws
would otherwise depend on who else was in the batch. A job may ask for attention maps instead of
ranked translations (``attention``); it merges only with jobs that ask the same.

Degrading, not falling: the queue holds at most ``max_queued`` jobs (then :class:`Busy`); a job that
waits past its deadline, or whose caller goes away, leaves the queue before it costs any decoding; a
merged batch that fails is retried job by job, so one bad request fails only itself; the worker task
survives any error; ``stop`` lets queued and running jobs finish (bounded) without blocking the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from app.inference.engine import AttentionMap, Engine, SearchSettings, Translation

log = logging.getLogger(__name__)
# Per sentence: ranked translations, or (an ``attention`` job) the best one's map (None when blank)
Results = list[list[Translation]] | list[AttentionMap | None]


# Characters per subword: Multi30k test German through unigram models trained on Multi30k measures 4.6
# (8,000 pieces) and 3.1 (1,000 pieces); text a model has not seen (random letters, digits) is nearer 1.
CHARS_PER_SUBWORD = 4


def subword_estimate(sentence: str) -> int:
    """The subwords ``sentence`` is counted as: one per started ``CHARS_PER_SUBWORD`` characters of each
    whitespace token, so a 1,000-letter word counts 250, not 1 (Multi30k test German: 1.7 per word, where
    the models above give 1.4 and 2.0)."""
    return sum(-(-len(word) // CHARS_PER_SUBWORD) for word in sentence.split())


def token_cost(sentences: list[str], settings: SearchSettings | None = None) -> int:
    """What a job costs against the budgets: (estimated subwords + one EOS per sentence) times the
    hypotheses decoded per sentence (``beam`` rows for search, ``nbest`` samples when sampling).

    An engine-independent stand-in for subword work (:func:`subword_estimate`), cheap enough to compute
    on the event loop."""
    tokens = sum(subword_estimate(s) + 1 for s in sentences)
    if settings is None:
        return tokens
    return tokens * (settings.nbest if settings.sampling is not None else settings.beam)


class Unavailable(Exception):
    """The request was not translated for a reason of the server's (answered 503 + Retry-After)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Busy(Unavailable):
    """The queue is full."""


class DeadlineExceeded(Unavailable):
    """The request waited (and ran) longer than its deadline."""


@dataclass
class Job:
    sentences: list[str]
    settings: SearchSettings
    result: asyncio.Future[Results]
    attention: bool = False  # attention maps (engine.attention_maps) instead of translate_nbest
    cost: int = field(init=False)
    queued_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.cost = token_cost(self.sentences, self.settings)

    def mergeable_with(self, other: Job) -> bool:
        same = self.settings == other.settings and self.attention == other.attention
        return self.settings.sampling is None and same

    def settle(self, results: Results | None = None, error: BaseException | None = None) -> None:
        """Hand the results (or the error) to the waiting caller, unless it has gone."""
        if self.result.done():
            return
        if error is not None:
            self.result.set_exception(error)
        else:
            self.result.set_result(results or [])


class Batcher:
    """Queue of jobs and the task that runs them; ``start`` and ``stop`` on the serving loop."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch_tokens: int = 8192,
        max_wait_ms: float = 5.0,
        max_queued: int = 256,
    ) -> None:
        if max_batch_tokens < 1 or max_wait_ms < 0 or max_queued < 1:
            raise ValueError(
                f"max_batch_tokens (got {max_batch_tokens}) and max_queued (got {max_queued}) must be >= 1, "
                f"max_wait_ms >= 0 (got {max_wait_ms})"
            )
        self.engine = engine
        self.max_batch_tokens, self.max_queued = max_batch_tokens, max_queued
        self.max_wait_s = max_wait_ms / 1000
        self.pending: deque[Job] = deque()
        self.arrived = asyncio.Event()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="translate")
        self.task: asyncio.Task[None] | None = None
        self.batches_run = 0  # engine calls made; merged requests make fewer
        self.running: list[Job] = []  # the batch the engine is translating now
        self.running_since: float | None = None
        self.batch_seconds = 0.1  # moving average of an engine call, for Retry-After
        self.closing = False

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(), name="batcher")

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def oldest_queued_s(self) -> float:
        """Age of the oldest request still waiting (0 when none waits)."""
        live = (job.queued_at for job in self.pending if not job.result.done())
        return max((time.monotonic() - t for t in live), default=0.0)

    def running_s(self) -> float:
        return 0.0 if self.running_since is None else time.monotonic() - self.running_since

    def retry_after(self) -> int:
        """Seconds until the queue has likely room again: the queued batches at the average speed."""
        return max(1, min(60, math.ceil(self.batch_seconds * (len(self.pending) + 1))))

    async def translate(
        self, sentences: list[str], settings: SearchSettings, timeout_s: float, *, attention: bool = False
    ) -> Results:
        """Queue ``sentences`` and wait for their translations (``attention``: their maps instead);
        :class:`Busy` when the queue is full, :class:`DeadlineExceeded` after ``timeout_s``. Cancelling
        the caller drops the queued job."""
        if self.closing or not self.alive:
            raise Unavailable("the server is shutting down" if self.closing else "the worker has stopped")
        if len(self.pending) >= self.max_queued:
            queued = len(self.pending)
            raise Busy(f"{queued} requests queued, the limit is {self.max_queued}", self.retry_after())
        job = Job(sentences, settings, asyncio.get_running_loop().create_future(), attention=attention)
        self.pending.append(job)
        self.arrived.set()
        try:
            return await asyncio.wait_for(job.result, timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineExceeded(
                f"not translated within the deadline of {timeout_s:g} s", self.retry_after()
            ) from None
        finally:
            with contextlib.suppress(ValueError):  # gone (taken into a batch) already
                self.pending.remove(job)

    async def run(self) -> None:
        while True:
            await self.arrived.wait()
            if self.max_wait_s:
                await asyncio.sleep(self.max_wait_s)  # let concurrent requests join the first one
            try:
                batch = self.take_batch()
                if not self.pending:
                    self.arrived.clear()
                if batch:
                    await self.run_batch(batch)
            except Exception:  # a bug here must not stop the service: log it and go on
                log.exception("the batcher failed; continuing")

    def take_batch(self) -> list[Job]:
        """The oldest live job plus every queued job it can merge with, within the cost budget."""
        while self.pending and self.pending[0].result.done():  # the client gave up
            self.pending.popleft()
        if not self.pending:
            return []
        head = self.pending.popleft()
        batch, cost, kept = [head], head.cost, deque()
        while self.pending:
            job = self.pending.popleft()
            if job.result.done():
                continue
            if head.mergeable_with(job) and cost + job.cost <= self.max_batch_tokens:
                batch.append(job)
                cost += job.cost
            else:
                kept.append(job)
        self.pending = kept
        return batch

    async def call_engine(self, jobs: list[Job]) -> Results:
        """The engine's results for ``jobs`` together, computed on the worker thread."""
        sentences = [s for job in jobs for s in job.sentences]
        call = self.engine.attention_maps if jobs[0].attention else self.engine.translate_nbest
        started = time.monotonic()
        results = await asyncio.get_running_loop().run_in_executor(
            self.worker, call, sentences, jobs[0].settings
        )
        self.batches_run += 1
        self.batch_seconds = 0.8 * self.batch_seconds + 0.2 * (time.monotonic() - started)
        return results

    async def run_batch(self, batch: list[Job]) -> None:
        """Translate ``batch``; if the merged call fails, each job alone, so each fails only itself."""
        self.running, self.running_since = batch, time.monotonic()
        try:
            try:
                results = await self.call_engine(batch)
            except Exception as err:
                if len(batch) == 1:
                    log.exception("translation failed for a request of %d sentences", len(batch[0].sentences))
                    batch[0].settle(error=err)
                    return
                log.warning("a merged batch of %d requests failed (%s); retrying each alone", len(batch), err)
                for job in batch:
                    if not job.result.done():
                        await self.run_batch([job])
                return
            start = 0
            for job in batch:
                job.settle(results[start : start + len(job.sentences)])
                start += len(job.sentences)
        finally:
            self.running, self.running_since = [], None

    async def idle(self) -> None:
        """Return once nothing is queued or running."""
        while any(not job.result.done() for job in self.pending) or self.running:
            await asyncio.sleep(0.01)

    async def stop(self, grace_s: float = 30.0) -> None:
        """Refuse new jobs, let queued and running ones finish for up to ``grace_s``, then fail the
        rest with :class:`Unavailable`. The event loop keeps serving while a batch finishes."""
        self.closing = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.idle(), grace_s)
        unfinished = [*self.pending, *self.running]  # cancelling the task forgets the running batch
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        for job in unfinished:
            job.settle(error=Unavailable("the server is shutting down"))
        self.pending.clear()
        self.worker.shutdown(wait=False, cancel_futures=True)  # a running call ends in its thread
