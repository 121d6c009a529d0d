"""A built model, wrapped from outside so that its decoding runs compiled where it can.

The model families (:mod:`app.models`) know nothing of compilation: a Transformer's ``encode`` and
``decode_step`` are plain PyTorch. :func:`accelerate` wraps a model (or each member of an ensemble) in
:class:`CompiledDecoding`, a :class:`~app.models.seq2seq.Seq2Seq` like any other, so greedy search, beam
search, sampling and scoring use it unchanged. Its ``encode`` and ``decode_step`` try, in order:

1. AOTInductor packages (``aot``, CPU): the encoder and the first step (:mod:`.aot_start`), the later steps
   (:mod:`.aot_step`), for one sentence or several, greedy or beam;
2. a ``torch.compile``d step (``on``, and ``aot`` for what no package fits: :mod:`.compiled_step`);
3. the model's own code, which also runs wherever a compiled path declines (training, gradients, attention
   weights asked for, a kernel's state a compiled step cannot take, a compilation that failed).

Every compiled path computes the model's own step function (:func:`.step.decode_cached`), so outputs are
those of the model up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from app.acceleration.aot_package import Packager
from app.acceleration.aot_start import AotStart
from app.acceleration.aot_step import AotSteps
from app.acceleration.compiled_step import CompiledSteps
from app.acceleration.step import CacheTensors, compile_available, inference_only
from app.models.ensemble import Ensemble
from app.models.seq2seq import EncoderOutput, Seq2Seq
from app.models.transformer import Transformer, TransformerState

COMPILE_MODES = ("auto", "on", "aot", "off")


class CompiledDecoding(Seq2Seq):
    """``model`` (a Transformer) whose encoder and decoding steps run compiled where they can (module doc).

    ``compiled``: the ``torch.compile``d steps; ``start`` and ``steps``: the ahead-of-time packages (None:
    not used). Everything else is the model's: training, scoring and attention maps call it directly.
    """

    def __init__(
        self,
        model: Transformer,
        *,
        compiled: CompiledSteps | None = None,
        start: AotStart | None = None,
        steps: AotSteps | None = None,
        packager: Packager | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.compiled, self.start, self.steps, self.packager = compiled, start, steps, packager
        self.pad_id, self.max_positions = model.pad_id, model.max_positions
        self.widens_beams = model.widens_beams

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def output_features(self, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, nn.Linear] | None:
        return self.model.output_features(src, tgt_in)

    def encode(self, src: Tensor) -> EncoderOutput:
        if self.start is not None and inference_only(self.model) and (encoded := self.start.encode(src)):
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
        if self.start is not None and self.steps is not None:
            tensors = CacheTensors.read(state.caches, held=True)
            if tensors is None:  # the first step (or a kernel's recurrent state: declined there too)
                log_probs = self.start.first_step(tokens, state)
            else:
                log_probs = self.steps(tokens, state, tensors)
            if log_probs is not None:
                return log_probs
        return None if self.compiled is None else self.compiled(tokens, state)

    def cross_attention(
        self, src: Tensor, tgt_in: Tensor, *, layer: int | None = None, head: int | None = None
    ) -> Tensor:
        return self.model.cross_attention(src, tgt_in, layer=layer, head=head)


def compiled(model: Transformer, *, ahead_of_time: bool) -> CompiledDecoding:
    """``model`` wrapped with ``torch.compile``d steps and, ``ahead_of_time``, AOTInductor packages."""
    if not ahead_of_time:
        return CompiledDecoding(model, compiled=CompiledSteps(model))
    packager = Packager()
    return CompiledDecoding(
        model,
        compiled=CompiledSteps(model),
        start=AotStart(model, packager),
        steps=AotSteps(model, packager),
        packager=packager,
    )


def accelerate(model: Seq2Seq, mode: str) -> tuple[Seq2Seq, str | None]:
    """``model`` for decoding with its Transformers' steps compiled by ``mode``, and why it stays eager
    (None: it compiles; a later failure still falls back, step by step).

    ``mode``: "on" compiles with ``torch.compile`` on any device, "auto" on the CPU only, "aot" as "on" and,
    on the CPU, through AOTInductor packages too; "off" returns ``model`` itself. An ensemble's members are
    wrapped one by one (they may differ in family); the wrapped model shares the parameters of ``model``.
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r} is not one of {', '.join(COMPILE_MODES)}")
    members = list(model.members) if isinstance(model, Ensemble) else [model]
    if mode == "off":
        return model, "compile=off"
    if not any(isinstance(m, Transformer) for m in members):
        return model, f"{type(model).__name__} has no Transformer decoder"
    device = next(model.parameters()).device
    if mode == "auto" and device.type != "cpu":
        return model, f"compile=auto compiles on the CPU only (the model is on {device})"
    if device.type == "cpu" and (reason := compile_available()) is not None:
        return model, reason
    ahead = mode == "aot" and device.type == "cpu"
    wrapped = [compiled(m, ahead_of_time=ahead) if isinstance(m, Transformer) else m for m in members]
    decoding = Ensemble(wrapped) if isinstance(model, Ensemble) else wrapped[0]
    return decoding.train(model.training), None


@dataclass
class CompileReport:
    """What the compiled paths of a wrapped model did so far (for the one-line report after a run)."""

    graphs: int = 0  # torch.compile graphs
    graph_seconds: float = 0.0
    packages: int = 0  # AOTInductor packages loaded (steps, encoder, first step)
    package_seconds: float = 0.0
    cache_hits: int = 0  # packages found already built
    failure: str | None = None  # torch.compile given up: why
    package_failure: str | None = None  # a package that failed to build: why

    @classmethod
    def of(cls, model: nn.Module) -> CompileReport:
        report = cls()
        for wrapper in model.modules():
            if not isinstance(wrapper, CompiledDecoding):
                continue
            if (steps := wrapper.compiled) is not None:
                report.graphs += steps.graphs
                report.graph_seconds += steps.seconds
                report.failure = report.failure or steps.failure
            if wrapper.packager is not None:
                report.packages += len(wrapper.steps.runners) + len(wrapper.start.runners)
                report.package_seconds += wrapper.packager.seconds
                report.cache_hits += wrapper.packager.cache_hits
                failures = [wrapper.steps.failure, *wrapper.start.failures.values()]
                report.package_failure = report.package_failure or next((f for f in failures if f), None)
        return report

    def line(self) -> str:
        if self.failure is not None:
            return f"decoding eager: torch.compile failed ({self.failure})"
        text = f"decoding steps compiled: {self.graphs} graphs in {self.graph_seconds:.1f} s"
        text += " (paid once per process)"
        if self.packages:
            text += f"; steps compiled ahead of time: {self.packages} package(s)"
            text += f" in {self.package_seconds:.1f} s"
            if self.cache_hits:
                text += f" ({self.cache_hits} found built in the package cache)"
        if self.package_failure:
            text += f"; steps not compiled ahead of time ({self.package_failure})"
        return text


__all__ = ["COMPILE_MODES", "CompileReport", "CompiledDecoding", "accelerate"]
