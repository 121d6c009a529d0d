"""What names an AOTInductor package in the cache: a digest of everything that decides what it computes,
taken before anything is exported, so that a package already built is loaded without exporting again.

Exporting a decoding step takes ~1-2 s (quickstart model, 2 CPU cores), about as long as loading its
package: a key over the exported program (this module's first form) made every package found in the cache
cost an export anyway, and AOT decoding of a 1,000-line file slower than eager (24.7 against 17.4 s,
docs/bench/decoding.md). The key is instead made from what the export would read:

- the code: every Python file of ``app/`` (the model, its kernels, the step function), as bytes;
- the module exported: each submodule's type and plain attributes (kernel options, sizes, flags; an
  object of another kind by its type's name), and every parameter, buffer and tensor attribute, as bytes;
- the inputs' dtypes and ranks and the symbolic sizes' ranges; the inductor settings;
- the torch and Python versions, inductor's environment variables, and the CPU (model and flags: the C++
  is built for its vector instructions).

Anything that changes what a package computes changes one of these, so an entry is never reused for a
different computation; what changes none of them (a comment elsewhere in the repository aside) cannot
change the program. A lazily drawn tensor (LSH's rotations, FAVOR's features) is in the key once drawn:
before that the key differs, and the package is built again under the new key, never reused wrongly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import types
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from app.hardware import cpu_flags, cpu_model

FORMAT = "2"  # bumped when what goes into the key changes
APP = Path(__file__).resolve().parents[1]
PLAIN = (bool, int, float, str, bytes, type(None))


@cache
def source_digest() -> str:
    """sha256 of every Python file under ``app/`` (path and bytes): the code a package was traced from."""
    digest = hashlib.sha256()
    for path in sorted(APP.rglob("*.py")):
        digest.update(str(path.relative_to(APP)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def tensor_bytes(tensor: Tensor) -> bytes:
    """A tensor as its dtype, shape and values (an opaque layout, e.g. a oneDNN-packed weight: its type)."""
    head = f"{tensor.dtype} {tuple(tensor.shape)} {tensor.layout}".encode()
    if tensor.layout != torch.strided or tensor.device.type == "meta":
        return head
    values = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return head + b"\0" + values


def describe(value: Any) -> bytes:
    """A plain attribute's value as bytes; a tensor by its values; anything else by its type's name (an
    address-bearing repr would name another package in every process)."""
    if isinstance(value, Tensor):
        return tensor_bytes(value)
    if isinstance(value, PLAIN):
        return repr(value).encode()
    if isinstance(value, (tuple, list)):
        return b"[" + b",".join(describe(v) for v in value) + b"]"
    if isinstance(value, dict):
        items = sorted(value.items(), key=str)
        return b"{" + b",".join(describe(k) + b":" + describe(v) for k, v in items) + b"}"
    if isinstance(value, Dim):  # a symbolic size (or one derived from it): its name and range
        return f"Dim({value.__name__}, {value.min}, {value.max})".encode()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__qualname__.encode() + describe(dataclasses.asdict(value))
    if isinstance(value, types.MethodType):
        return f"method {value.__func__.__qualname__}".encode()
    return f"<{type(value).__module__}.{type(value).__qualname__}>".encode()


def module_parts(module: nn.Module) -> Iterable[bytes]:
    """Every submodule's name, type and attributes, then every parameter and buffer, as bytes."""
    for name, sub in module.named_modules(remove_duplicate=False):
        yield f"module {name} {type(sub).__module__}.{type(sub).__qualname__}".encode()
        for key, value in sorted(vars(sub).items()):
            if key not in ("_parameters", "_buffers", "_modules") and not key.startswith("_forward"):
                yield key.encode() + b"=" + describe(value)
    for name, tensor in [*module.named_parameters(remove_duplicate=False), *module.named_buffers()]:
        yield name.encode() + b"=" + tensor_bytes(tensor)


def package_key(module: nn.Module, args: tuple[Tensor, ...], shapes: tuple, configs: dict[str, Any]) -> str:
    """sha256 (hex) of what a package of ``module`` exported over ``args`` with the symbolic sizes
    ``shapes`` and compiled with ``configs`` computes (see the module doc)."""
    digest = hashlib.sha256()
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith(("TORCHINDUCTOR_", "TORCH_")))
    for part in (
        FORMAT,
        torch.__version__,
        sys.version.split()[0],
        cpu_model(),
        " ".join(sorted(cpu_flags())),
        repr(environment),
        repr(sorted(configs.items())),
        source_digest(),
        repr([(a.dtype, a.dim()) for a in args]),
    ):
        digest.update(str(part).encode() + b"\0")
    digest.update(describe(shapes) + b"\0")
    for part in module_parts(module):
        digest.update(part + b"\0")
    return digest.hexdigest()


def model_id(model: nn.Module) -> str:
    """A short digest of ``model``'s code and weights: which packages were built for it is noted under this
    name (for estimates only: :func:`package_key` alone decides what a package is)."""
    digest = hashlib.sha256(source_digest().encode())
    for part in module_parts(model):
        digest.update(part + b"\0")
    return digest.hexdigest()[:24]
