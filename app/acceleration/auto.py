"""How a translator decodes: the model itself (``off``), through AOTInductor packages (``aot``), or, by
default (``auto``), through packages once they pay for themselves, one-time costs included.

Measured (``scripts/bench_compile_modes.py``, quickstart checkpoint, 2-core AMD EPYC with avx512_bf16, one
thread; docs/bench/decoding.md, "Which compile modes earn their lines"): packages make steady decoding
faster, batch-1 greedy 1.58x (49.5 against 31.3 ms a sentence) and beam 5 at batch 64 1.16x (73.5 against
85.3 sentences/s), but each costs ~15 s to build the first time on a machine and ~1.2 s to load after (the
first load imports inductor). Eager decoding costs nothing up front.
So one sentence is fastest eager, and a server, which pays once before it listens and then decodes for
hours, with packages; in between it depends on how much a process will translate, which ``translate.py``
reading a stream does not know in advance.

The rule of :class:`AutoDecoding`, before each batch: the packages would save ``gain`` (the measured
fraction for this shape) of the eager time still to come, estimated as the larger of what is left of the
current call and what has been decoded eagerly so far (a process that has decoded much is likely to decode
more: the rent-or-buy argument, which keeps the total within about twice the better choice made in
hindsight). When that saving passes the one-time cost of the packages this shape needs (those noted in the
package cache as built, at a load's cost; the others at a build's), decoding switches to them and stays.
The choice is reported once, at the end (:meth:`AutoDecoding.report`).
"""

from __future__ import annotations

import logging
from typing import Protocol

from app.acceleration.decoding import CompiledDecoding, CompileReport, accelerate
from app.acceleration.step import compile_available
from app.models.seq2seq import Seq2Seq

log = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "aot", "off")

# The fraction of eager decoding time packages save (medians of 4 alternating processes each, above)
GAIN_ONE_ROW = 0.37  # one sentence, greedy: 49.5 -> 31.3 ms a sentence
GAIN_ROWS = 0.14  # several rows (beams, sentences): beam 5 at batch 64, 73.5 -> 85.3 sentences/s
# One package's one-time cost, seconds on 2 CPU cores: built the first time (one sentence's three packages:
# 46.1 s against 3.4 eager), loaded after (6.95 s against 3.35)
BUILD_SECONDS = 15.0
LOAD_SECONDS = 1.2


class Decoding(Protocol):
    """What a translator asks before and after each batch it decodes."""

    def model_for(self, left: int, sentences: int, beam: int) -> Seq2Seq:
        """The model to search with for a batch of ``sentences`` at ``beam``, ``left`` of the call's
        sentences still to decode (this batch's included)."""
        ...

    def record(self, model: Seq2Seq, sentences: int, seconds: float) -> None:
        """That ``model`` decoded ``sentences`` in ``seconds``."""
        ...

    def report(self) -> str | None:
        """One line on how it decoded (None: nothing to say)."""
        ...


class FixedDecoding:
    """Always the same model: ``off`` (the model) or ``aot`` (it wrapped with packages)."""

    def __init__(self, model: Seq2Seq, mode: str, reason: str | None = None) -> None:
        self.model, self.mode, self.reason = model, mode, reason

    def model_for(self, left: int, sentences: int, beam: int) -> Seq2Seq:
        return self.model

    def record(self, model: Seq2Seq, sentences: int, seconds: float) -> None:
        pass

    def report(self) -> str | None:
        if self.mode == "off":
            return None
        if self.reason is not None:
            return f"decoding eager (compile={self.mode}): {self.reason}"
        return CompileReport.of(self.model).line()


class AutoDecoding:
    """Eager until packages pay for themselves (see the module doc); ``packaged`` is the model wrapped by
    :func:`~app.acceleration.decoding.accelerate` (an ensemble: its members wrapped)."""

    def __init__(self, model: Seq2Seq, packaged: Seq2Seq) -> None:
        self.model, self.packaged = model, packaged
        self.switched = False
        self.unavailable: str | None = None  # why packages cannot be built here, found when switching
        self.eager_seconds, self.eager_sentences = 0.0, 0
        self.estimate = ""  # the last comparison made, for the report

    def model_for(self, left: int, sentences: int, beam: int) -> Seq2Seq:
        if self.switched or self.eager_sentences == 0:  # the first batch measures eager speed
            return self.packaged if self.switched else self.model
        per_sentence = self.eager_seconds / self.eager_sentences
        to_come = max(left * per_sentence, self.eager_seconds)
        gain = GAIN_ONE_ROW if sentences == beam == 1 else GAIN_ROWS
        cost = self.one_time_cost(sentences, beam)
        self.estimate = f"{gain:.0%} of ~{to_come:.1f} s against ~{cost:.1f} s for the packages"
        if gain * to_come > cost and self.can_build():
            self.switched = True
            log.info("compile=auto: switching to ahead-of-time packages (%s)", self.estimate)
            return self.packaged
        return self.model

    def can_build(self) -> bool:
        """Whether inductor finds a C++ compiler (looked for once, when packages would first pay)."""
        if self.unavailable is None:
            self.unavailable = compile_available() or ""
        return not self.unavailable

    def one_time_cost(self, sentences: int, beam: int) -> float:
        """Seconds to build or load the packages a batch of ``sentences`` at ``beam`` needs, every member."""
        size = "b" if sentences > 1 else "1"
        needed = {f"encoder_{size}", f"first_step_{size}", f"step_{size}x{beam}x1"}
        if sentences > 1:
            needed.add(f"step_1x{beam}x1")  # the batch's last sentence alone
        cost = 0.0
        for wrapper in self.wrappers():
            built = wrapper.packager.built()
            cost += sum(LOAD_SECONDS if name in built else BUILD_SECONDS for name in needed)
        return cost

    def wrappers(self) -> list[CompiledDecoding]:
        return [m for m in self.packaged.modules() if isinstance(m, CompiledDecoding)]

    def record(self, model: Seq2Seq, sentences: int, seconds: float) -> None:
        if model is self.model:
            self.eager_seconds += seconds
            self.eager_sentences += sentences

    def report(self) -> str:
        if self.switched:
            packages = CompileReport.of(self.packaged).line()
            return f"compile=auto: ahead-of-time packages ({self.estimate}); {packages}"
        why = f": {self.unavailable or self.estimate}" if self.estimate else ""
        count = f"{self.eager_sentences} sentence{'' if self.eager_sentences == 1 else 's'}"
        return f"compile=auto: decoded eagerly, {count}{why}"


def decoding_for(model: Seq2Seq, mode: str) -> Decoding:
    """How ``model`` decodes under ``--compile mode`` (auto | aot | off; another names the valid ones)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r} is not one of {', '.join(COMPILE_MODES)}")
    if mode == "off":
        return FixedDecoding(model, "off")
    packaged, reason = accelerate(model, check_compiler=mode == "aot")
    if reason is not None:
        return FixedDecoding(model, mode, reason)
    return AutoDecoding(model, packaged) if mode == "auto" else FixedDecoding(packaged, "aot")


__all__ = ["COMPILE_MODES", "AutoDecoding", "Decoding", "FixedDecoding", "decoding_for"]
