"""The encoder and the first decoding step compiled ahead of time with AOTInductor, for the CPU: the start
of a translation, before the later steps of :mod:`app.acceleration.aot_step` take over.

Why: at batch 1 with greedy search the later steps ran as packages and about a quarter of a sentence's time
stayed eager: the encoder (~2.3 ms, quickstart model) and the first step (~3.7 ms: it computes every layer's
cross-attention keys and values from the encoder output). As packages they take ~3.5 ms together; a whole
sentence 1.12x faster (in-process A/B, 60 test sentences, 7 alternating rounds, one thread, AMD EPYC). At
beam 5 and batch 64 they are a small part of the time: 305 -> 290 ms for 256 sentences.

What is compiled, with the source length S symbolic, one package for one sentence and one for several
(the sentence count B symbolic, 2 to :data:`~app.acceleration.aot_step.MAX_SENTENCES`):

- the encoder. For several sentences the positions of the real tokens are found before the package (their
  count depends on the data, which a program exported once cannot follow) and handed to it, so its
  position-wise work runs over those rows only, as the eager encoder's does (:mod:`app.attention.packing`);
- the first step: one row per sentence (greedy search, and beam search before it widens its beams), empty
  caches in, filled ones out (each layer's self-attention keys and values of one position, its
  cross-attention keys and values of the source), for models whose caches the later packages take plainly
  (no sliding window, no recurrent state, no cross-attention keys reduced along the source).

Fallback: an export or compile error is warned about once and that part (encoder or first step) stays eager;
the other part and the later steps' packages go on.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn
from torch.export import Dim

from app.acceleration.aot_package import MAX_SENTENCES, FlatRunner, Packager
from app.acceleration.step import describe_failure
from app.attention import KVCache, padding_mask
from app.attention.packing import PackedRows
from app.models.seq2seq import EncoderOutput
from app.models.transformer import DecoderLayer, LayerCache, TransformerState

ENCODER, FIRST_STEP = "encoder", "first step"


class ExportedEncoder(nn.Module):
    """The encoder as a module of flat tensors: ``src`` (B, S) and, for several sentences, the flat
    positions (N,) of its real tokens -> memory (B, S, D), zero at the padding, and its mask (B, S)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, index: Tensor | None = None) -> tuple[Tensor, Tensor]:
        mask = padding_mask(src, self.model.pad_id)
        packed = None
        if index is not None:
            batch, length = src.shape
            packed = PackedRows(index, index // length, index % length, batch, length)
        encoded = self.model.encode_rows(src, mask, packed)
        return encoded.memory, encoded.mask


class ExportedFirstStep(nn.Module):
    """The first step as a module of flat tensors: ``tokens`` (B,), memory (B, S, D), its mask (B, S) ->
    log-probabilities (B, V), then each layer's self keys, self values (B, Hkv, 1, Dh), cross keys, cross
    values (B, Hkv, S, Dh)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, memory: Tensor, memory_mask: Tensor) -> tuple[Tensor, ...]:
        state = self.model.start_decoding(EncoderOutput(memory=memory, mask=memory_mask))
        log_probs = self.model.decode_step(tokens, state)
        caches = state.caches
        return (
            log_probs,
            *(c.self_attn.k for c in caches),
            *(c.self_attn.v for c in caches),
            *(c.cross_attn.k for c in caches),
            *(c.cross_attn.v for c in caches),
        )


class AotStart:
    """The encoder and the first step through AOTInductor packages (see the module doc)."""

    def __init__(self, model: nn.Module, packager: Packager) -> None:
        self.model, self.packager = model, packager  # a Transformer; the export, cache and seconds
        self.runners: dict[tuple[str, bool], FlatRunner] = {}  # (part, several sentences) -> loaded package
        self.failures: dict[str, str] = {}  # part -> why it stays eager

    def encode(self, src: Tensor) -> EncoderOutput | None:
        """The encoder's output for ``src`` (B, S) through a package; None where it does not fit."""
        if ENCODER in self.failures or not self.fits(src.size(0), src.size(1), src.device):
            return None
        several = src.size(0) > 1
        # Several: the real tokens' positions, found here (their count depends on the data), the
        # position-wise work in the package over those rows only
        args = (src, PackedRows.of(padding_mask(src, self.model.pad_id)).index) if several else (src,)
        runner = self.runner(ENCODER, several, args)
        if runner is None:
            return None
        memory, mask = runner(*args)
        return EncoderOutput(memory=memory, mask=mask)

    def first_step(self, tokens: Tensor, state: TransformerState) -> Tensor | None:
        """Log-probabilities (B, V) of the first step after ``tokens`` (B,), filling ``state``'s caches;
        None where it does not fit."""
        memory = state.memory
        if not (
            FIRST_STEP not in self.failures
            and state.step == 0
            and state.group == 1
            and tokens.size(0) == memory.size(0)
            and memory.dtype == torch.float32
            and self.fits(*memory.shape[:2], memory.device)
            and all(map(plain_and_empty, self.model.decoder, state.caches))
        ):
            return None
        args = (tokens, memory, state.memory_mask)
        runner = self.runner(FIRST_STEP, memory.size(0) > 1, args)
        if runner is None:
            return None
        log_probs, *caches = runner(*args)
        n = len(state.caches)
        for i, cache in enumerate(state.caches):
            cache.self_attn.replace(caches[i], caches[n + i])
            cache.cross_attn.replace(caches[2 * n + i], caches[3 * n + i])
        state.step += 1
        return log_probs

    def fits(self, sentences: int, length: int, device: torch.device) -> bool:
        """Whether a batch of ``sentences`` sources of ``length`` positions fits a package."""
        return (
            device.type == "cpu"
            and sentences <= MAX_SENTENCES
            and 2 <= length <= self.model.max_positions
            and not torch.is_autocast_enabled("cpu")  # the package computes as exported: float32
            and next(self.model.parameters()).dtype == torch.float32
        )

    def runner(self, part: str, several: bool, args: tuple[Tensor, ...]) -> FlatRunner | None:
        """The loaded package of ``part`` (built at its first call), or None after a failure (warned)."""
        if (runner := self.runners.get((part, several))) is not None:
            return runner
        module, shapes = self.exported(part, several, len(args))
        name = f"{part.replace(' ', '_')}_{'b' if several else '1'}"
        frozen = several or part == ENCODER  # the one-row first step: MKL's product beats oneDNN's packed one
        try:
            runner = self.packager.package(module, args, shapes, name, frozen=frozen)
        except Exception as error:
            self.failures[part] = describe_failure(error)
            warnings.warn(f"the {part} not compiled ahead of time ({self.failures[part]})", stacklevel=4)
            return None
        self.runners[part, several] = runner
        return runner

    def exported(self, part: str, several: bool, inputs: int) -> tuple[nn.Module, tuple]:
        """The module that computes ``part`` and the symbolic sizes of its first ``inputs`` inputs: the source
        length, and the sentence count for ``several``."""
        source = Dim("source", min=2, max=self.model.max_positions)
        batch = {0: Dim("sentences", min=2, max=MAX_SENTENCES)} if several else {}
        if part == ENCODER:
            rows = {0: Dim("rows", min=2, max=MAX_SENTENCES * self.model.max_positions)}  # real tokens
            return ExportedEncoder(self.model), ({**batch, 1: source}, rows)[:inputs]
        return ExportedFirstStep(self.model), (batch, {**batch, 1: source}, {**batch, 1: source})


def plain_and_empty(layer: DecoderLayer, cache: LayerCache) -> bool:
    """Whether a decoder layer's caches are still empty and of the kind the packages take plainly."""
    self_kernel, cross_kernel = layer.self_attn.kernel, layer.cross_attn.kernel
    return (
        not (cache.self_attn.filled or cache.cross_attn.filled)
        and isinstance(cache.self_attn, KVCache)
        and cache.self_attn.max_len is None
        and not self_kernel.capabilities.recurrent
        and not cross_kernel.capabilities.reduces_keys
    )
