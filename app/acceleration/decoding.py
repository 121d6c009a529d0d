"""A built model, wrapped from outside so that its decoding runs compiled where it can.

The model families (:mod:`app.models`) know nothing of compilation: a Transformer's ``encode`` and
``decode_step`` are plain PyTorch. :func:`accelerate` wraps a model (or each member of an ensemble) in
:class:`CompiledDecoding`, a :class:`~app.models.seq2seq.Seq2Seq` like any other, so greedy search, beam
search, sampling and scoring use it unchanged. Its ``encode`` and ``decode_step`` try, in order:

1. AOTInductor packages (CPU): the encoder and the first step (:mod:`.aot_start`), the later steps
   (:mod:`.aot_step`), for one sentence or several, greedy or beam;
2. the model's own code, wherever a package declines (training, gradients, a kernel's state a package
   cannot take: sliding windows, reduced or recurrent keys; bf16 autocast; a package that failed to build).

Every package computes the model's own step function (:func:`.step.decode_cached`), so outputs are those
of the model up to float rounding.

Which of the two a translator uses (``--compile off``, ``aot``, or by default ``auto``: packages once they
pay for themselves) is :mod:`.auto`'s. A ``torch.compile``d step (``--compile on`` until 2026-11-28) was
measured against them and removed: it sped up no steady decoding of the quickstart model and cost 15-65 s
a process (docs/bench/decoding.md, "Which compile modes earn their lines").
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from app.acceleration.aot_package import Packager
from app.acceleration.aot_start import AotStart
from app.acceleration.aot_step import AotSteps
from app.acceleration.step import CacheTensors, compile_available, inference_only
from app.models.ensemble import Ensemble
from app.models.seq2seq import EncoderOutput, Seq2Seq
from app.models.transformer import Transformer, TransformerState


class CompiledDecoding(Seq2Seq):
    """``model`` (a Transformer) whose encoder and decoding steps run through AOTInductor packages where
    they can (see the module doc). Everything else is the model's: training, scoring and attention maps
    call it directly."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.packager = Packager(model)  # the export, the package cache and the seconds, shared by both parts
        self.start = AotStart(model, self.packager)  # the encoder and the first step
        self.steps = AotSteps(model, self.packager)  # the later steps
        self.pad_id, self.max_positions = model.pad_id, model.max_positions
        self.widens_beams = model.widens_beams

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def output_features(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, nn.Linear] | None:
        return self.model.output_features(src, tgt_in)

    def encode(self, src: Tensor) -> EncoderOutput:
        if inference_only(self.model) and (encoded := self.start.encode(src)) is not None:
            return encoded
        return self.model.encode(src)

    def start_decoding(self, encoded: EncoderOutput) -> TransformerState:
        return self.model.start_decoding(encoded)

    def start_beams(self, encoded: EncoderOutput, beams: int) -> TransformerState:
        return self.model.start_beams(encoded, beams)

    def widen_beams(self, state: TransformerState, beams: int) -> None:
        self.model.widen_beams(state, beams)

    def decode_step(self, tokens: Tensor, state: TransformerState) -> Tensor:
        """Log-probabilities (B, V) after ``tokens`` (B,): the first compiled path that takes the step."""
        if inference_only(self.model) and (log_probs := self.compiled_step(tokens, state)) is not None:
            return log_probs
        return self.model.decode_step(tokens, state)

    def compiled_step(self, tokens: Tensor, state: TransformerState) -> Tensor | None:
        """The step through a package, or None where none takes it."""
        tensors = CacheTensors.read(state.caches, held=True)
        if tensors is None:  # the first step (or a kernel's recurrent state: declined there too)
            return self.start.first_step(tokens, state)
        return self.steps(tokens, state, tensors)

    def cross_attention(
        self, src: Tensor, tgt_in: Tensor, *, layer: int | None = None, head: int | None = None
    ) -> Tensor:
        return self.model.cross_attention(src, tgt_in, layer=layer, head=head)


def accelerate(model: Seq2Seq, *, check_compiler: bool = True) -> tuple[Seq2Seq, str | None]:
    """``model`` with every Transformer wrapped in :class:`CompiledDecoding` (an ensemble's members one by
    one: they may differ in family), sharing its parameters; or ``model`` itself and why packages cannot be
    used here (None: they can; a package that fails later still falls back, shape by shape).
    ``check_compiler=False`` leaves out the look for a C++ compiler (importing inductor: ~2 s), for a
    caller that may never build a package (:class:`~app.acceleration.auto.AutoDecoding`)."""
    members = list(model.members) if isinstance(model, Ensemble) else [model]
    if not any(isinstance(m, Transformer) for m in members):
        return model, f"{type(model).__name__} has no Transformer decoder"
    device = next(model.parameters()).device
    if device.type != "cpu":
        return model, f"ahead-of-time packages are built for the CPU (the model is on {device})"
    if check_compiler and (reason := compile_available()) is not None:
        return model, reason
    wrapped = [CompiledDecoding(m) if isinstance(m, Transformer) else m for m in members]
    decoding = Ensemble(wrapped) if isinstance(model, Ensemble) else wrapped[0]
    return decoding.train(model.training), None


@dataclass
class CompileReport:
    """What the packages of a wrapped model did so far (for the one-line report after a run)."""

    packages: int = 0  # AOTInductor packages loaded (steps, encoder, first step)
    seconds: float = 0.0  # exporting, building or finding, loading: paid once per process
    cache_hits: int = 0  # packages found already built
    failure: str | None = None  # the first package that failed to build: why

    @classmethod
    def of(cls, model: nn.Module) -> CompileReport:
        report = cls()
        for wrapper in model.modules():
            if isinstance(wrapper, CompiledDecoding):
                report.packages += len(wrapper.steps.runners) + len(wrapper.start.runners)
                report.seconds += wrapper.packager.seconds
                report.cache_hits += wrapper.packager.cache_hits
                failures = [wrapper.steps.failure, *wrapper.start.failures.values()]
                report.failure = report.failure or next((f for f in failures if f), None)
        return report

    def line(self) -> str:
        text = f"decoding compiled ahead of time: {self.packages} package(s) in {self.seconds:.1f} s"
        if self.cache_hits:
            text += f" ({self.cache_hits} found built in the package cache)"
        if self.failure:
            text += f"; some steps stay eager ({self.failure})"
        return text


__all__ = ["CompileReport", "CompiledDecoding", "accelerate"]
