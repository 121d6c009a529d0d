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
from dataclasses import dataclass, field

import torch
from torch import Tensor

from app.attention import KVCache

COMPILE_MODES = ("auto", "on", "aot", "off")
GRAPHS_PER_MODEL = 32  # dynamo's recompile limit per code object (default 8) is raised to at least this:
# a model meets up to ~8 shapes (batch 1 or more, first or later step, greedy or beam rows, one sentence
# left), and past the limit dynamo would run the step eagerly without a word


@dataclass
class CacheTensors:
    """The tensors of a decoder's caches, one entry per layer (the compiled function's inputs/outputs)."""

    self_k: list[Tensor]  # (B*G, Hkv, T, Dh) each
    self_v: list[Tensor]
    cross_k: list[Tensor]  # (B, Hkv, S, Dh) each (or k reduced rows, or B*G rows: see MultiHeadAttention)
    cross_v: list[Tensor]
    cross_mask: list[Tensor | None]  # (B, k) for kernels that reduce keys (linformer), else None
    windows: tuple[int | None, ...] = field(default=())  # each self cache's ``max_len`` (sliding windows)
    rows: Tensor | None = None  # (B*G,) with ``held``: the rows of self_k/self_v each decoder row goes on
    # from (a beam reorder not applied yet); None: self_k/self_v are the decoder's rows in order

    @classmethod
    def read(cls, caches: list, *, held: bool = False) -> CacheTensors | None:
        """The tensors of ``caches`` (a TransformerState's), or None before they are all filled.

        ``held``: the self-attention caches as stored, with the reorder they hold back as ``rows`` (for a
        step that gathers those rows as it appends, one copy instead of two); without it, or where the
        layers hold different reorders, the reorder is applied first."""
        for cache in caches:
            if not (cache.self_attn.filled and cache.cross_attn.filled) or cache.self_attn.state is not None:
                return None
        stored = [c.self_attn.held() for c in caches]
        rows = stored[0][2]
        if held and all(same_rows(pending, rows) for *_, pending in stored):
            self_k, self_v = [k for k, _, _ in stored], [v for _, v, _ in stored]
        else:
            self_k, self_v, rows = [c.self_attn.k for c in caches], [c.self_attn.v for c in caches], None
        return cls(
            self_k=self_k,
            self_v=self_v,
            rows=rows,
            cross_k=[c.cross_attn.k for c in caches],
            cross_v=[c.cross_attn.v for c in caches],
            cross_mask=[c.cross_attn.key_mask for c in caches],
            windows=tuple(c.self_attn.max_len for c in caches),
        )

    def caches(self, group: int) -> list:
        """Fresh cache objects over these tensors (inside the compiled function)."""
        from app.models.transformer import LayerCache

        return [
            LayerCache(
                self_attn=KVCache(k=sk, v=sv, max_len=window),
                cross_attn=KVCache(k=ck, v=cv, static=True, key_mask=mask, group=group),
            )
            for sk, sv, ck, cv, mask, window in zip(
                self.self_k,
                self.self_v,
                self.cross_k,
                self.cross_v,
                self.cross_mask,
                self.windows,
                strict=True,
            )
        ]


def same_rows(a: Tensor | None, b: Tensor | None) -> bool:
    """Whether two held-back reorders keep the same rows (None: none held)."""
    return a is b or (a is not None and b is not None and torch.equal(a, b))


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


def describe_failure(error: BaseException) -> str:
    """One line: the error's type and the first line of its root cause (dynamo wraps what inductor raised,
    as ``inner_exception`` of its BackendCompilerFailed, raised ``from None``)."""
    root = error
    while (inner := getattr(root, "inner_exception", None) or root.__cause__) is not None:
        root = inner
    message = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
    kinds = type(error).__name__ if root is error else f"{type(error).__name__} <- {type(root).__name__}"
    return f"{kinds}: {message[:300]}"


def compile_available() -> str | None:
    """Why inductor cannot compile for the CPU here (no C++ compiler), or None when it can."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as error:
        return f"no C++ compiler for inductor ({type(error).__name__}: {error})"
    return None


class CompiledSteps:
    """``decode_step`` after the first step of a Transformer, through ``torch.compile``; see the module doc.

    Called by :meth:`Transformer.decode_step`; returns None where the eager step must run instead
    (step 0, a recurrent kernel, attention weights asked for, or compilation failed).
    """

    def __init__(
        self, model, *, max_rows: int = 64, cpp_wrapper: bool = True, ahead_of_time: bool = False
    ) -> None:
        self.model = model  # a Transformer; a plain attribute, so the model does not own itself as a module
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
        self.ahead = None  # steps compiled ahead of time (compile mode "aot"), tried first
        if ahead_of_time:
            from app.models.aot_step import AotSteps

            self.ahead = AotSteps(self)

    def __call__(self, tokens: Tensor, state) -> Tensor | None:
        """Log-probabilities (B, V) after ``tokens`` (B,), updating ``state``; None: run the eager step."""
        if self.failure is not None or self.model.training or torch.is_grad_enabled():
            return None
        if self.ahead is not None and (log_probs := self.ahead(tokens, state)) is not None:
            return log_probs  # any row count: the packages' products go through oneDNN-packed weights
        if tokens.size(0) > self.max_rows:
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
            warnings.warn(f"decoding stays eager: torch.compile failed ({self.failure})", stacklevel=2)
            return None
        new_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames
        if new_graphs:
            self.graphs += new_graphs
            self.seconds += time.perf_counter() - started
        for cache, k, v in zip(state.caches, self_k, self_v, strict=True):
            cache.self_attn.k, cache.self_attn.v = k, v
        state.step += 1
        return log_probs

    def encode(self, src: Tensor):
        """The encoder's output for ``src`` (B, S) through an ahead-of-time package (compile mode "aot"), or
        None: run the eager encoder."""
        if self.ahead is None or self.model.training or torch.is_grad_enabled():
            return None
        return self.ahead.start.encode(src)

    def step(
        self,
        tokens: Tensor,
        step: int,
        memory: Tensor,
        memory_mask: Tensor,
        group: int,
        tensors: CacheTensors,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """The compiled function: one eager step over fresh cache objects; the new self-attention caches.

        ``tokens`` (B*G,), ``memory`` (B, S, D), ``memory_mask`` (B, S); returns log-probabilities
        (B*G, V) and each layer's self-attention keys and values (B*G, Hkv, T+1, Dh).
        """
        from app.models.transformer import TransformerState

        caches = tensors.caches(group)
        state = TransformerState(
            memory=memory, memory_mask=memory_mask, caches=caches, step=step, group=group
        )
        log_probs = self.model.eager_decode_step(tokens, state)
        return log_probs, [c.self_attn.k for c in caches], [c.self_attn.v for c in caches]


def compile_decoding(model: torch.nn.Module, mode: str) -> str | None:
    """Compile the decoding steps of every Transformer in ``model`` (itself, or an ensemble's members).

    ``mode``: "on" compiles on any device, "auto" on the CPU only (where it was measured to pay), "aot" as
    "on" and, on the CPU, one sentence's steps (batch 1, greedy or beam) through AOTInductor
    (:mod:`app.models.aot_step`), "off" never. Returns why decoding stays eager, or None when it compiles
    (a later failure still falls back).
    """
    from app.models.transformer import Transformer

    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r} is not one of {', '.join(COMPILE_MODES)}")
    transformers = [m for m in model.modules() if isinstance(m, Transformer)]
    if mode == "off" or not transformers:
        for transformer in transformers:
            transformer.compiled_steps = None
        return "compile=off" if mode == "off" else f"{type(model).__name__} has no Transformer decoder"
    device = next(model.parameters()).device
    if mode == "auto" and device.type != "cpu":
        return f"compile=auto compiles on the CPU only (the model is on {device})"
    if device.type == "cpu" and (reason := compile_available()) is not None:
        return reason
    ahead = mode == "aot" and device.type == "cpu"
    for transformer in transformers:
        transformer.compiled_steps = CompiledSteps(transformer, ahead_of_time=ahead)
    return None
