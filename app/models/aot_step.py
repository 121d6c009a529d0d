"""One sentence's decoding steps (batch 1: greedy's one row, beam search's K) compiled ahead of time with
AOTInductor, for the CPU.

Why: a ``torch.compile``d step pays dynamo's entry on every call: guards over the model's parameters and
the cache tensors, the step's bytecode, the runtime wrappers. At one row a step's products take ~1.1 ms
and that entry ~0.3-0.4 ms (the profiler's "TorchDynamo Cache Lookup" and "Torch-Compiled Region" around
the graph). ``torch.export`` traces the same step function once, with the source length S and the cache
length T symbolic, AOTInductor compiles it into a shared library with the weights inside, and a call is
then the library's C++ run of the graph, checking only its inputs' sizes.

What is compiled: :meth:`CompiledSteps.step <app.models.compiled_step.CompiledSteps.step>`, the function
``torch.compile`` compiles, for the rows of one sentence (batch 1: one row greedy, K rows with beam K; one
package per row count, up to :data:`MAX_ROWS`) with caches the compiled path can hand over plainly: no
sliding window (its cache trims itself by a size test), no reduced cross-attention keys (Linformer's
mask), a source of 2 tokens or more, from the second step on (T >= 1: the cache length is exported
size-oblivious, so a cache of one position does not specialize it). Anything else (several sentences, the
first step, which fills the cross-attention caches) returns None and goes on to the ``torch.compile``d or
eager step. Packages of two rows or more are built with inductor's freezing, so their products run
through oneDNN over weights packed at build (:data:`FROZEN_FROM_ROWS`). A batch of several sentences that
shrinks to one (the others finished) uses, and if need be builds, the package of its row count too. A
package is built at the first step that fits its row count (~13-25 s on 2 CPU cores, reported with the
compile time) into a temporary folder and lives as long as the model. Fallback: an export or compile
error is warned about once and every such step stays on the other path.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from app.models.compiled_step import CacheTensors, describe_failure

if TYPE_CHECKING:
    from app.models.compiled_step import CompiledSteps


MAX_ROWS = 16  # the largest beam compiled ahead of time (one package per row count)
# From this many rows the package is built with inductor's freezing: the weights become constants and its
# products go through oneDNN over weights packed at build, as the eager engine's wide linears do from 2
# rows. Beam 5 at batch 1: 74.4 -> 49.6 ms a sentence; at one row MKL's product stays faster (greedy 35.1
# against 49.7 ms frozen), as in the eager engine (scratch, 30 test sentences, 3 rounds each).
FROZEN_FROM_ROWS = 2


class SentenceStep(nn.Module):
    """The step as a module of flat tensors, for ``torch.export``: tokens (G,) for one sentence's G rows,
    memory (1, S, D), its mask (1, S), then each layer's self keys, self values (G, Hkv, T, Dh), cross
    keys, cross values (1 or G, Hkv, S, Dh: shared by the beams or one copy each)."""

    def __init__(self, steps: CompiledSteps, layers: int, group: int) -> None:
        super().__init__()
        self.steps, self.layers, self.group = steps, layers, group
        self.model = steps.model  # a submodule: export lifts its weights into the program

    def forward(
        self, tokens: Tensor, memory: Tensor, memory_mask: Tensor, *caches: Tensor
    ) -> tuple[Tensor, ...]:
        n = self.layers
        tensors = CacheTensors(
            self_k=list(caches[:n]),
            self_v=list(caches[n : 2 * n]),
            cross_k=list(caches[2 * n : 3 * n]),
            cross_v=list(caches[3 * n :]),
            cross_mask=[None] * n,
            windows=(None,) * n,
        )
        step = caches[0].size(2)  # T positions decoded so far (no window: the step number)
        log_probs, self_k, self_v = self.steps.step(tokens, step, memory, memory_mask, self.group, tensors)
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


class AotSentenceSteps:
    """One sentence's steps through AOTInductor packages of :class:`SentenceStep` (see the module doc)."""

    def __init__(self, steps: CompiledSteps) -> None:
        self.steps = steps
        self.runners: dict[tuple[int, int], object] = {}  # (rows, cross-attention rows) -> loaded package
        self.failure: str | None = None
        self.seconds = 0.0  # export + compile + load, all packages
        self._folder: tempfile.TemporaryDirectory | None = None

    def fits(self, tokens: Tensor, state, tensors: CacheTensors) -> bool:
        """Whether a package computes this step: one sentence, float32, plain caches, 1 <= T < max
        positions, S >= 2."""
        length = tensors.self_k[0].size(2)
        return (
            self.failure is None
            and state.memory.size(0) == 1
            and tokens.size(0) == state.group <= MAX_ROWS
            and tokens.device.type == "cpu"
            and state.memory.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")  # the package computes as exported: float32
            and all(window is None for window in tensors.windows)
            and all(mask is None for mask in tensors.cross_mask)
            and state.step == length >= 1
            and length < self.steps.model.max_positions
            and state.memory.size(1) >= 2
        )

    def __call__(self, tokens: Tensor, state, tensors: CacheTensors) -> Tensor | None:
        """Log-probabilities (G, V) after ``tokens`` (G,), updating ``state``; None where it does not fit."""
        if not self.fits(tokens, state, tensors):
            return None
        caches = (*tensors.self_k, *tensors.self_v, *tensors.cross_k, *tensors.cross_v)
        caches = tuple(map(standard_strides, caches))
        key = (tokens.size(0), tensors.cross_k[0].size(0))
        if (runner := self.runners.get(key)) is None:
            try:
                runner = self.runners[key] = self.build(tokens, state, caches, key)
            except Exception as error:
                self.failure = describe_failure(error)
                warnings.warn(f"decoding steps not compiled ahead of time ({self.failure})", stacklevel=3)
                return None
        log_probs, *new = runner(tokens, state.memory, state.memory_mask, *caches)
        layers = len(state.caches)
        for cache, k, v in zip(state.caches, new[:layers], new[layers:], strict=True):
            cache.self_attn.k, cache.self_attn.v = k, v
        state.step += 1
        return log_probs

    def build(self, tokens: Tensor, state, caches: tuple[Tensor, ...], key: tuple[int, int]):
        """Export the step for these rows with S and T symbolic, compile it with AOTInductor, load it.
        ``key``: (rows, cross-attention rows), the package's name."""
        from torch.export import Dim

        started = time.perf_counter()
        model = self.steps.model
        source = Dim("source", min=2, max=model.max_positions)
        cached = Dim("cached", min=1, max=model.max_positions - 1)  # one more position must fit
        layers = len(state.caches)
        shapes = (
            {},
            {1: source},
            {1: source},
            (*[{2: cached}] * (2 * layers), *[{2: source}] * (2 * layers)),
        )
        args = (tokens, state.memory, state.memory_mask, *caches)
        # A cache of one position (step 1) stays symbolic instead of specialized to its size
        size_oblivious = torch.fx.experimental._config.patch(backed_size_oblivious=True)
        with torch.no_grad(), warnings.catch_warnings(), size_oblivious:
            warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations, raised inside export
            program = torch.export.export(
                SentenceStep(self.steps, layers, state.group), args, dynamic_shapes=shapes, strict=False
            )
            if self._folder is None:
                self._folder = tempfile.TemporaryDirectory(prefix="attn-mt-aot-")
            rows, cross_rows = key
            package = torch._inductor.aoti_compile_and_package(
                program,
                package_path=str(Path(self._folder.name) / f"step_{rows}x{cross_rows}.pt2"),
                inductor_configs={"freezing": rows >= FROZEN_FROM_ROWS},
            )
            runner = torch._inductor.aoti_load_package(package)
        self.seconds += time.perf_counter() - started
        return runner
