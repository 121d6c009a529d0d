"""Decoding steps (greedy and beam search, one sentence or several) compiled ahead of time with
AOTInductor, for the CPU.

Why: at one row an eager step is ~745 aten calls, most of them tiny (views, layer norms, residual adds,
head reshapes) around ~30 matrix products. ``torch.export`` traces the step once, with the source length S
and the cache length T symbolic, AOTInductor fuses the small work into a few C++ kernels and compiles it all
into a shared library with the weights inside; a call is the library's C++ run of the graph, checking only
its inputs' sizes (a ``torch.compile``d step paid ~0.3-0.4 ms of guards per call on top: removed).

What is compiled: :func:`~app.acceleration.step.decode_cached`, for G rows per sentence (1 greedy, K with
beam K, up to :data:`MAX_ROWS`): one package per G for one sentence (batch 1), and one per G for several with
the sentence count B symbolic (2 to :data:`~app.acceleration.aot_package.MAX_SENTENCES`: a batch of 64, and
the batch as its sentences finish). The caches must be ones a package can take plainly: no sliding window
(its cache trims itself by a size test), no reduced cross-attention keys (Linformer's mask); a source of 2
tokens or more; from the second step on (T >= 1: the cache length is exported size-oblivious, so a cache of
one position does not specialize it). The first step, which fills the cross-attention caches, and the
encoder have packages of their own (:mod:`app.acceleration.aot_start`); anything else returns None and the
model's own step runs.

The self-attention caches come in as stored, with the reorder beam search holds back
(:meth:`KVCache.held <app.attention.cache.KVCache.held>`) as row indices, and the package gathers the kept
rows straight into the grown cache: one copy of the caches a step, where gathering first and then appending
made two (beam 5 at batch 64: 1.045x). Packages of two rows or more are built with inductor's freezing, so
their products run through oneDNN over weights packed at build (:data:`FROZEN_FROM_ROWS`). A package is
needed at the first step that fits it: found in the package cache of :mod:`app.acceleration.aot_cache`
(kept across processes) or exported and compiled into it (~13-25 s on 2 CPU cores); the time is reported
apart. Fallback: an export or compile error is warned about once and the steps of that shape (one sentence
or several, rows per sentence) stay on the model's own code; the other shapes' packages go on.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn
from torch.export import Dim

from app.acceleration.aot_package import MAX_SENTENCES, FlatRunner, Packager
from app.acceleration.step import CacheTensors, decode_cached, describe_failure
from app.models.transformer import TransformerState

MAX_ROWS = 16  # the largest beam compiled ahead of time (one package per row count)
# From this many rows the package is built with inductor's freezing: the weights become constants and its
# products go through oneDNN over weights packed at build, as the eager engine's wide linears do from 2
# rows. Beam 5 at batch 1: 74.4 -> 49.6 ms a sentence; at one row MKL's product stays faster (greedy 35.1
# against 49.7 ms frozen), as in the eager engine (scratch, 30 test sentences, 3 rounds each).
FROZEN_FROM_ROWS = 2


class ExportedStep(nn.Module):
    """The step as a module of flat tensors, for ``torch.export``: tokens (B*G,) for B sentences' G rows
    each, rows (B*G,) the stored self-cache row each one goes on from, memory (B, S, D), its mask (B, S),
    then each layer's self keys, self values as stored (R, Hkv, T, Dh), cross keys, cross values (B or
    B*G, Hkv, S, Dh: shared by a sentence's beams, or one copy each)."""

    def __init__(self, model: nn.Module, layers: int, group: int) -> None:
        super().__init__()
        self.layers, self.group = layers, group
        self.model = model  # a submodule: export lifts its weights into the program

    def forward(
        self, tokens: Tensor, rows: Tensor, memory: Tensor, memory_mask: Tensor, *caches: Tensor
    ) -> tuple[Tensor, ...]:
        n = self.layers
        # The kept rows (B*G,) of the self caches as stored (any row count), gathered where the step
        # appends the new position: inductor writes them straight into the grown cache, one copy
        kept = [cache.index_select(0, rows) for cache in caches[: 2 * n]]
        tensors = CacheTensors(
            self_k=kept[:n],
            self_v=kept[n:],
            cross_k=list(caches[2 * n : 3 * n]),
            cross_v=list(caches[3 * n :]),
            cross_mask=[None] * n,
            windows=(None,) * n,
        )
        step = caches[0].size(2)  # T positions decoded so far (no window: the step number)
        log_probs, self_k, self_v = decode_cached(
            self.model, tokens, step, memory, memory_mask, self.group, tensors
        )
        return (log_probs, *self_k, *self_v)


def standard_strides(tensor: Tensor) -> Tensor:
    """``tensor`` with the strides its sizes give a contiguous tensor (a copy only where they differ).

    A cache of one position counts as contiguous whatever its stride along that position (the first step's
    head-split view keeps the projection's), and the package, compiled with that length symbolic, expects
    the strides its sizes give: handed the view, its second step decoded differently from eager (27 of 30
    test sentences).
    """
    expected, step = [], 1
    for size in reversed(tensor.shape):
        expected.append(step)
        step *= size
    if tensor.stride() == tuple(reversed(expected)):
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


class AotSteps:
    """Decoding steps through AOTInductor packages of :class:`ExportedStep` (see the module doc)."""

    def __init__(self, model: nn.Module, packager: Packager) -> None:
        self.model, self.packager = model, packager  # a Transformer; the export, cache and seconds
        self.runners: dict[tuple[bool, int, int], FlatRunner] = {}  # see build's key -> loaded package
        self.failure: str | None = None  # the first build that failed, why (for the compile report)
        self.failed: set[tuple[bool, int, int]] = set()  # keys (see build) whose package failed: not retried

    def fits(self, tokens: Tensor, state: TransformerState, tensors: CacheTensors) -> bool:
        """Whether a package computes this step: G <= MAX_ROWS rows per sentence, float32, plain caches,
        1 <= T < max positions, S >= 2."""
        length, sentences = tensors.self_k[0].size(2), state.memory.size(0)
        return (
            tokens.size(0) == sentences * state.group
            and state.group <= MAX_ROWS
            and sentences <= MAX_SENTENCES
            and tensors.cross_k[0].size(0) in (sentences, tokens.size(0))  # shared by the beams, or copied
            and tokens.device.type == "cpu"
            and state.memory.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")  # the package computes as exported: float32
            and all(window is None for window in tensors.windows)
            and all(mask is None for mask in tensors.cross_mask)
            and state.step == length >= 1
            and length < self.model.max_positions
            and state.memory.size(1) >= 2
        )

    def __call__(self, tokens: Tensor, state: TransformerState, tensors: CacheTensors) -> Tensor | None:
        """Log-probabilities (B*G, V) after ``tokens`` (B*G,), updating ``state`` (whose caches read as
        ``tensors``, reorders held back); None where no package fits."""
        if not self.fits(tokens, state, tensors):
            return None
        sentences = state.memory.size(0)
        key = (sentences > 1, state.group, tensors.cross_k[0].size(0) // sentences)
        if key in self.failed:
            return None
        rows = tensors.rows
        if rows is None:
            rows = torch.arange(tokens.size(0), device=tokens.device)
        caches = (*tensors.self_k, *tensors.self_v, *tensors.cross_k, *tensors.cross_v)
        caches = tuple(map(standard_strides, caches))
        if (runner := self.runners.get(key)) is None:
            try:
                runner = self.runners[key] = self.build(tokens, rows, state, caches, key)
            except Exception as error:
                # This shape stays on the other path; the packages of other shapes go on
                self.failed.add(key)
                failure = describe_failure(error)
                self.failure = self.failure or failure
                warnings.warn(f"decoding steps not compiled ahead of time ({failure})", stacklevel=3)
                return None
        log_probs, *new = runner(tokens, rows, state.memory, state.memory_mask, *caches)
        layers = len(state.caches)
        for cache, k, v in zip(state.caches, new[:layers], new[layers:], strict=True):
            cache.self_attn.replace(k, v)  # the held-back reorder is in them
        state.step += 1
        return log_probs

    def build(
        self,
        tokens: Tensor,
        rows: Tensor,
        state: TransformerState,
        caches: tuple[Tensor, ...],
        key: tuple[bool, int, int],
    ) -> FlatRunner:
        """Export the step with S and T symbolic (and the sentence count B, for several), compile it with
        AOTInductor, load it. ``key``: (several sentences, rows G per sentence, cross-attention rows C per
        sentence)."""
        model = self.model
        several, group, cross = key
        source = Dim("source", min=2, max=model.max_positions)
        cached = Dim("cached", min=1, max=model.max_positions - 1)  # one more position must fit
        sentences = Dim("sentences", min=2, max=MAX_SENTENCES)
        stored = Dim("stored", min=1, max=MAX_SENTENCES * MAX_ROWS)  # self-cache rows before the reorder
        times = lambda n: {0: sentences if n == 1 else n * sentences} if several else {}  # noqa: E731
        layers = len(state.caches)
        shapes = (
            times(group),
            times(group),
            {**times(1), 1: source},
            {**times(1), 1: source},
            (*[{0: stored, 2: cached}] * (2 * layers), *[{**times(cross), 2: source}] * (2 * layers)),
        )
        args = (tokens, rows, state.memory, state.memory_mask, *caches)
        name = f"step_{'b' if several else '1'}x{group}x{cross}"
        frozen = several or group >= FROZEN_FROM_ROWS
        return self.packager.package(ExportedStep(model, layers, group), args, shapes, name, frozen=frozen)
