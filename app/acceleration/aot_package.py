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
from typing import Any

import torch
from torch import Tensor, nn

from app.acceleration.aot_cache import PackageStore
from app.acceleration.aot_key import model_id, package_key

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
    """Finds or compiles the packages of one model's parts, loads them; counts the seconds and cache hits."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.seconds = 0.0  # export + compile (or find) + load, all packages
        self._store: PackageStore | None = None  # made at the first package
        self._model_id: str | None = None

    @property
    def store(self) -> PackageStore:
        if self._store is None:
            self._store = PackageStore()
        return self._store

    @property
    def model_id(self) -> str:
        """:func:`~app.acceleration.aot_key.model_id` of the model, computed once."""
        if self._model_id is None:
            self._model_id = model_id(self.model)
        return self._model_id

    @property
    def cache_hits(self) -> int:
        """Packages found already built in the package cache rather than compiled."""
        return 0 if self._store is None else self._store.hits

    def built(self) -> set[str]:
        """The names of this model's packages noted in the cache (built before, by any process)."""
        return self.store.noted(self.model_id)

    def package(
        self, module: nn.Module, args: tuple, shapes: tuple, name: str, *, frozen: bool
    ) -> FlatRunner:
        """``module`` over ``args`` with the symbolic sizes ``shapes``: its package found in the package
        cache, or exported, compiled with AOTInductor (``frozen``: with inductor's freezing) and stored;
        loaded. The time it took is added to :attr:`seconds`."""
        started = time.perf_counter()
        try:
            package = self.load_or_build(module, args, shapes, name, {"freezing": frozen})
        except Exception:
            if not frozen:
                raise
            # Inductor's freezing fails on some graphs that compile without it (the FAVOR encoder of
            # several sentences: its lifted random features); unfrozen, the products stay MKL's
            package = self.load_or_build(module, args, shapes, name, {"freezing": False})
        self.seconds += time.perf_counter() - started
        return FlatRunner(package)

    def load_or_build(self, module: nn.Module, args: tuple, shapes: tuple, name: str, configs: dict) -> Any:
        """The package of ``module`` compiled with ``configs``, from the store or built into it."""
        exported = []

        def export() -> torch.export.ExportedProgram:
            # A size of one (a cache of one position, at step 1) stays symbolic instead of specialized to it
            size_oblivious = torch.fx.experimental._config.patch(backed_size_oblivious=True)
            with torch.no_grad(), size_oblivious:
                exported.append(torch.export.export(module, args, dynamic_shapes=shapes, strict=False))
            return exported[-1]

        # One eager call first: kernels draw their fixed random tensors at first use (LSH's rotations,
        # FAVOR's features, from a seeded generator), which a package cannot do; drawn, they are constants
        # (and in the key)
        with torch.no_grad():
            module(*args)
        key = package_key(module, args, shapes, configs)
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):  # torch's own, raised inside export/build
                warnings.simplefilter("ignore", category)
            package = self.store.load_or_build(key, name, export, configs)
        self.store.note(self.model_id, name)
        if exported:  # exporting built ~250k long-lived objects: out of later full collections
            exported.clear()
            settle_long_lived_objects()
        return package
