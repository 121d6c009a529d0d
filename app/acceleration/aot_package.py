"""Building and calling AOTInductor packages: a module exported once with symbolic sizes, compiled into a
shared library with its weights inside, kept in the package cache, and called from C++ on plain tensors.

Why a package rather than ``torch.compile``: a compiled function pays dynamo's entry on every call (guards
over the model's parameters and its inputs, the runtime wrappers: ~0.3-0.4 ms, a quarter of a batch-1
step); a package checks only its inputs' sizes. :class:`Packager` is what the decoding steps
(:mod:`app.acceleration.aot_step`) and the start of a translation (:mod:`app.acceleration.aot_start`)
share: the export, the package cache (:mod:`app.acceleration.aot_cache`) and the time it all took.
"""

from __future__ import annotations

import gc
import time
import warnings

import torch
from torch import Tensor, nn

from app.acceleration.aot_cache import PackageStore

MAX_SENTENCES = 4096  # the most sentences a batch may hold for the packages of several


class FlatRunner:
    """A loaded package called with its flat input tensors straight into its C++ runner.

    The package's own ``__call__`` parses its input and output tree specs from JSON, flattens the arguments
    and rebuilds the outputs on every call: ~100-150 us, a tenth of a batch-1 step. The modules exported
    here take and return flat tensors only, so the runner's list of outputs is already the result.
    """

    def __init__(self, package) -> None:
        self.package = package
        self.run = getattr(getattr(package, "loader", None), "boxed_run", None)  # None: a torch without it

    def __call__(self, *tensors: Tensor) -> list[Tensor] | tuple[Tensor, ...]:
        if self.run is None:
            return self.package(*tensors)
        return self.run(list(tensors))


def settle_long_lived_objects() -> None:
    """Collect once, then freeze what is left, so later full collections skip it.

    Exporting imports and builds ~250k long-lived Python objects (FX, sympy, inductor), doubling what each
    full collection of the cycle collector traverses (96 -> 223 ms, beam 5 process); one such collection
    falling inside a batch cost 8% of it (2.65 -> 2.91 s, 256 sentences). Frozen objects are still freed
    when their reference count drops; only cycles among them are no longer collected.
    """
    gc.collect()
    gc.freeze()


class Packager:
    """Exports modules, finds or compiles their packages, loads them; counts the seconds and cache hits."""

    def __init__(self) -> None:
        self.seconds = 0.0  # export + compile (or find) + load, all packages
        self._store: PackageStore | None = None  # made at the first package

    @property
    def cache_hits(self) -> int:
        """Packages found already built in the package cache rather than compiled."""
        return 0 if self._store is None else self._store.hits

    def package(
        self, module: nn.Module, args: tuple, shapes: tuple, name: str, *, frozen: bool
    ) -> FlatRunner:
        """``module`` exported over ``args`` with the symbolic sizes ``shapes``, compiled with AOTInductor
        (``frozen``: with inductor's freezing) or found built in the package cache, and loaded; the time it
        took is added to :attr:`seconds`."""
        started = time.perf_counter()
        # A size of one (a cache of one position, at step 1) stays symbolic instead of specialized to it
        size_oblivious = torch.fx.experimental._config.patch(backed_size_oblivious=True)
        with torch.no_grad(), warnings.catch_warnings(), size_oblivious:
            warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations, raised inside export
            # One eager call first: kernels draw their fixed random tensors at first use (LSH's rotations,
            # FAVOR's features, from a seeded generator), which a package cannot do; drawn, they are constants
            module(*args)
            program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
            if self._store is None:
                self._store = PackageStore()
            try:
                package = self._store.load_or_build(program, name, {"freezing": frozen})
            except Exception:
                if not frozen:
                    raise
                # Inductor's freezing fails on some graphs that compile without it (the FAVOR encoder of
                # several sentences: its lifted random features); unfrozen, the products stay MKL's
                package = self._store.load_or_build(program, name, {"freezing": False})
            runner = FlatRunner(package)
        del program
        settle_long_lived_objects()
        self.seconds += time.perf_counter() - started
        return runner
