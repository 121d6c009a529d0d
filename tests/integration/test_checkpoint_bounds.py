"""A checkpoint's config cannot make opening it cost more than its file justifies (issue 49).

Small crafted files -- a config asking for 100,000 layers, a width of a million, a position table of 10^9
or 10^6 rows, weights that claim more data than they store, a sentencepiece model of a million pieces
or of garbage -- are each refused with an error naming the checkpoint, in a child process under an
address-space cap, within :data:`REFUSED_WITHIN_MIB` of memory more than opening a good checkpoint took.
A malformed sentencepiece model ends translate.py (and its ``--ensemble``) and the server with an
``error:`` line, exit status 2, not sentencepiece's traceback.
"""

from __future__ import annotations

import copy
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import uvicorn
from helpers.training import REPO_ROOT

from app.checkpoint import CHECKPOINT_KEY, read_checkpoint, save_atomically
from app.inference import cli

pytestmark = pytest.mark.usefixtures("single_torch_thread")

REFUSED_WITHIN_MIB = 64  # peak resident memory over all refusals, beyond what opening the good file took
CAP_MIB = 1024  # the child's address space may grow this much past its size after the good load

# One piece entry of a sentencepiece ModelProto (field 1: piece "▁", score -20): 12 bytes.
PIECE = b"\x0a\x0a\x0a\x03" + "\u2581".encode() + b"\x15" + struct.pack("<f", -20.0)


def model_option(**options: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c[CHECKPOINT_KEY]["config"]["model"].update(options)


def expanded_embedding(checkpoint: dict[str, Any]) -> None:
    """A zero-stride view: a (200, 32) tensor over a single stored number."""
    weight = checkpoint["state_dict"]["model.src_embed.weight"]
    checkpoint["state_dict"]["model.src_embed.weight"] = torch.zeros(()).expand(weight.shape)


# name -> (how the good checkpoint is changed, what the refusal says; None: it opens)
CASES: dict[str, tuple[Callable[[dict[str, Any]], Any], str | None]] = {
    "layers_100000": (
        model_option(encoder_layers=100_000),
        r"encoder_layers=100000 .*layers must lie in 1\.\.64",
    ),
    "layers_64": (model_option(encoder_layers=64), r"weights do not fit .*encoder\.1\.\S+ is missing"),
    "d_model_1e6": (model_option(d_model=10**6), r"d_model=1000000 .*width must lie in 1\.\.65,536"),
    "d_model_65536": (model_option(d_model=65536), r"asks for more than its weights hold"),
    "positions_1e9": (model_option(max_positions=10**9), r"max_positions=1000000000 .*1\.\.32,768"),
    "positions_1e6": (model_option(max_positions=10**6), r"max_positions=1000000 .*1\.\.32,768"),
    "zero_stride": (
        expanded_embedding,
        r"src_embed\.weight \(200, 32\) claims more data than the file stores",
    ),
    "spm_1008000_pieces": (
        lambda c: c[CHECKPOINT_KEY].update(src_spm=c[CHECKPOINT_KEY]["src_spm"] + PIECE * 1_008_000),
        r"translation\.src_spm is refused: a sentencepiece model of 12,\d{3},\d{3} bytes; at most 8,388,608",
    ),
    "spm_malformed": (
        lambda c: c[CHECKPOINT_KEY].update(tgt_spm=b"\x0a\xff not a model"),
        r"translation\.tgt_spm is refused: not a valid sentencepiece model",
    ),
    "positions_32768": (model_option(max_positions=32768), None),  # the documented limit opens
}

CHILD = f"""
import json, resource, sys
from app.checkpoint import load_model

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

load_model(sys.argv[1])  # the good file: imports, allocator arenas
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + {CAP_MIB} * 2**20, resource.RLIM_INFINITY))
base, results = peak_mib(), {{}}
for name, path in json.loads(sys.argv[2]).items():
    try:
        load_model(path)
        outcome = "opened"
    except BaseException as err:
        outcome = f"{{type(err).__name__}}: {{err}}"
    results[name] = [outcome, peak_mib() - base]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def good(tiny_checkpoint: Path) -> Path:
    """The checkpoint the crafted files start from (tests/integration/conftest.py)."""
    return tiny_checkpoint


def crafted(good: dict[str, Any], directory: Path, change: Callable[[dict[str, Any]], Any]) -> Path:
    """``good`` changed by ``change``, saved as ``directory/crafted.ckpt``."""
    checkpoint = copy.deepcopy(good)
    change(checkpoint)
    path = directory / "crafted.ckpt"
    directory.mkdir()
    save_atomically(checkpoint, path)
    return path


def test_crafted_checkpoints_are_refused_within_a_small_memory(good: Path, tmp_path: Path) -> None:
    base = read_checkpoint(good)
    paths = {name: str(crafted(base, tmp_path / name, change)) for name, (change, _) in CASES.items()}
    assert Path(paths["layers_100000"]).stat().st_size < 2**20  # small, like the 544 KB file
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(good), json.dumps(paths)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(child.stdout.splitlines()[-1])
    for name, (_, message) in CASES.items():
        outcome, grew_mib = results[name]
        if message is None:
            assert outcome == "opened", name
        else:
            assert outcome.startswith("CheckpointError: ") and paths[name] in outcome, (name, outcome)
            assert re.search(message, outcome), (name, outcome)
        assert grew_mib <= REFUSED_WITHIN_MIB, (name, grew_mib, results)


@pytest.fixture(scope="module")
def malformed_spm(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    change = CASES["spm_malformed"][0]
    return crafted(read_checkpoint(good), tmp_path_factory.mktemp("spm") / "bad", change)


@pytest.mark.parametrize("as_member", [False, True], ids=["model", "ensemble_member"])
def test_translate_names_a_malformed_sentencepiece_model(
    good: Path, malformed_spm: Path, as_member: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(good), "--ensemble", str(malformed_spm)] if as_member else [str(malformed_spm)]
    assert cli.main([*args, "Ein Hund."]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{malformed_spm}: its sentencepiece model" in err
    assert "Traceback" not in err and "RuntimeError" not in err


def test_serve_names_a_malformed_sentencepiece_model(
    malformed_spm: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: pytest.fail("the server started"))
    spec = importlib.util.spec_from_file_location("script_serve", REPO_ROOT / "scripts" / "serve.py")
    assert spec is not None and spec.loader is not None
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    assert serve.main([str(malformed_spm), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and f"{malformed_spm}: its sentencepiece model" in err
