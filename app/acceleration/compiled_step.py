"""The Transformer's cached decoder step compiled with ``torch.compile`` (inductor), eager as the fallback.

Why: at batch 1 an eager decoding step is ~745 aten calls, most of them tiny (views, layer norms,
residual adds, head reshapes), around ~30 matrix products that move the weights. Inductor fuses the
elementwise work into a few generated C++ kernels and, with ``cpp_wrapper``, launches them and the
matrix products from C++, so a step costs little more than its matrix products.

What is compiled: every step after the first. Step 0 stays eager: it fills the cross-attention caches
(keys and values of the encoder output, once per sentence) and starts the self-attention caches. From
then on one function takes plain tensors (the caches' keys and values) and returns the next ones, so
dynamo guards a few tensors instead of the state objects, and the cache length, batch rows and source
length are dynamic: one graph serves every step and batch (plus the sizes that are 1, which torch
specializes). The compile time is paid once per process and kept in :attr:`CompiledSteps.seconds`.

Fallback: anything compilation cannot handle (no C++ compiler, an operation inductor does not lower)
raises on the first call; the step is then recomputed eagerly, a warning says why, and later steps stay
eager. Recurrent kernels (linear attention's state) are left eager from the start.
"""

from __future__ import annotations

import time
import types
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

from app.acceleration.step import CacheTensors, decode_cached, describe_failure
from app.models.transformer import TransformerState

GRAPHS_PER_MODEL = 32  # dynamo's recompile limit per code object (default 8) is raised to at least this:
# a model meets up to ~8 shapes (batch 1 or more, first or later step, greedy or beam rows, one sentence
# left), and past the limit dynamo would run the step eagerly without a word


def mark_dynamic(tokens: Tensor, memory: Tensor, memory_mask: Tensor, tensors: CacheTensors) -> None:
    """Compile for any batch rows, source length and cache length, not the first call's sizes.

    ``maybe_mark_dynamic`` leaves a size of 1 (batch 1, the first cached step) specialized, so those get
    graphs of their own; the step number becomes dynamic once a second value is seen (automatic dynamic).
    """
    mark = torch._dynamo.maybe_mark_dynamic
    mark(tokens, 0)  # B*G rows
    for tensor in (memory, memory_mask):
        mark(tensor, 0)  # B sentences
        mark(tensor, 1)  # S source positions
    for tensor in (*tensors.self_k, *tensors.self_v):
        mark(tensor, 0)
        mark(tensor, 2)  # T positions cached so far
    for tensor in (*tensors.cross_k, *tensors.cross_v, *(m for m in tensors.cross_mask if m is not None)):
        mark(tensor, 0)
        if tensor.dim() == 4:
            mark(tensor, 2)  # S (or a kernel's reduced rows)


def own_code(method: Callable) -> Callable:
    """``method`` (bound) over a copy of its function's code object.

    Dynamo keeps compiled graphs, and counts them against its recompile limit, per code object: without a
    copy every model compiled in a process (an ensemble's members, checkpoints compared on validation)
    would share one list of graphs, searched on every call.
    """
    func = method.__func__
    code = func.__code__.replace()  # an equal but distinct code object
    copy = types.FunctionType(code, func.__globals__, func.__name__, func.__defaults__, func.__closure__)
    return types.MethodType(copy, method.__self__)


class CompiledSteps:
    """A Transformer's decoding steps after the first, through ``torch.compile``; see the module doc.

    Called by :class:`~app.acceleration.decoding.CompiledDecoding`; returns None where the model's own
    step must run instead (step 0, a recurrent kernel, too many rows, or compilation failed).
    """

    def __init__(self, model: nn.Module, *, max_rows: int = 64, cpp_wrapper: bool = True) -> None:
        self.model = model  # a Transformer
        # Above ``max_rows`` decoder rows (beam 5 at batch 64: 320) a step is bound by its matrix products
        # and the compiled one was slower than eager (0.90x, in-process A/B on the random 5.8M model)
        self.max_rows = max_rows
        options = {"cpp_wrapper": cpp_wrapper}
        # Sizes that vary are marked dynamic per call (:func:`mark_dynamic`); the rest (model widths)
        # stay static, so the generated kernels know them and dynamo guards fewer symbols.
        self.compiled = torch.compile(own_code(self.step), dynamic=None, options=options)
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, GRAPHS_PER_MODEL)
        # Each call's guards reach every parameter through the model's module dicts (~900 checks a step at
        # batch 1, about an eighth of a compiled step in the profiler's "TorchDynamo Cache Lookup"); with
        # recursive dict tags an unchanged module subtree is passed over whole (a third less lookup time). A
        # module or parameter replaced changes its dict's tag, so those guards still run then.
        config.use_recursive_dict_tags_for_guards = True
        self.failure: str | None = None  # why compilation was given up (then every step is eager)
        self.seconds = 0.0  # wall time of the calls that compiled a graph (compile time, reported apart)
        self.graphs = 0  # graphs compiled so far

    def __call__(self, tokens: Tensor, state: TransformerState) -> Tensor | None:
        """Log-probabilities (B, V) after ``tokens`` (B,), updating ``state``; None: run the model's step."""
        if self.failure is not None or tokens.size(0) > self.max_rows:
            return None
        tensors = CacheTensors.read(state.caches)
        if tensors is None:
            return None
        mark_dynamic(tokens, state.memory, state.memory_mask, tensors)
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        started = time.perf_counter()
        try:
            log_probs, self_k, self_v = self.compiled(
                tokens, state.step, state.memory, state.memory_mask, state.group, tensors
            )
        except Exception as error:
            self.failure = describe_failure(error)
            warnings.warn(f"decoding stays eager: torch.compile failed ({self.failure})", stacklevel=3)
            return None
        new_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames
        if new_graphs:
            self.graphs += new_graphs
            self.seconds += time.perf_counter() - started
        for cache, k, v in zip(state.caches, self_k, self_v, strict=True):
            cache.self_attn.replace(k, v)
        state.step += 1
        return log_probs

    def step(
        self,
        tokens: Tensor,
        step: int,
        memory: Tensor,
        memory_mask: Tensor,
        group: int,
        tensors: CacheTensors,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The compiled function (:func:`~app.acceleration.step.decode_cached` of this model), a method so
        that each model gets a code object of its own (:func:`own_code`)."""
        return decode_cached(self.model, tokens, step, memory, memory_mask, group, tensors)
