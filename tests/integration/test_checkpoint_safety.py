"""Opening a checkpoint never runs code from it: a real pickle payload (an object whose ``__reduce__``
creates a marker file) is refused, with no side effect, by every program that opens checkpoints --
translate.py, the server (and its --ensemble), export, averaging, rescore and train.py's resume."""

from __future__ import annotations

import builtins
import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import uvicorn
from helpers.models import TINY_TRANSFORMER
from helpers.training import REPO_ROOT, compose_train, run_translate, tiny_overrides, write_corpus_slice

from app.checkpoint import CHECKPOINT_KEY, CheckpointError, load_model, read_checkpoint, save_atomically
from app.training.task import train

pytestmark = pytest.mark.usefixtures("single_torch_thread")


class Payload:
    """What an attacker would hide in a checkpoint: unpickling it calls ``open(marker, "w")``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        return builtins.open, (str(self.marker), "w")


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module, to call its ``main`` in this process."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", REPO_ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def good(
    checkpoint_factory: Callable[..., torch.nn.Module], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("good") / "model.ckpt"
    checkpoint_factory(path, model_cfg=TINY_TRANSFORMER, attention_cfg={"kernel": "eager"})
    return path


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "PAYLOAD_RAN"


def poison(good: Path, path: Path, marker: Path) -> Path:
    """A copy of ``good`` with the payload hidden among its data, written the way torch.save writes."""
    checkpoint = read_checkpoint(good)
    checkpoint[CHECKPOINT_KEY]["valid_search"]["note"] = Payload(marker)
    save_atomically(checkpoint, path)
    return path


@pytest.fixture
def poisoned(good: Path, tmp_path: Path, marker: Path) -> Path:
    return poison(good, tmp_path / "poisoned.ckpt", marker)


def test_the_payload_is_live(poisoned: Path, marker: Path) -> None:
    """The test's own control: an unrestricted torch.load does run the payload."""
    torch.load(poisoned, weights_only=False)
    assert marker.is_file()


def test_read_checkpoint_refuses_the_payload(poisoned: Path, marker: Path) -> None:
    with pytest.raises(CheckpointError, match=r"refused to open .*poisoned\.ckpt.*GLOBAL io\.open") as err:
        read_checkpoint(poisoned)
    assert str(poisoned) in str(err.value)
    assert not marker.exists()


def test_translate_cli_refuses_the_payload(poisoned: Path, marker: Path) -> None:
    result = run_translate(str(poisoned), "--beam", "1", stdin=b"Ein Hund.\n")
    assert result.returncode == 2
    assert b"refused to open" in result.stderr and str(poisoned).encode() in result.stderr
    assert b"Traceback" not in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("as_member", [False, True], ids=["model", "ensemble_member"])
def test_serve_refuses_the_payload(
    good: Path,
    poisoned: Path,
    marker: Path,
    as_member: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: pytest.fail("the server started"))
    args = [str(good), "--ensemble", str(poisoned)] if as_member else [str(poisoned)]
    assert load_script("serve").main([*args, "--port", "0"]) == 2
    assert "refused to open" in capsys.readouterr().err
    assert not marker.exists()


def test_export_refuses_the_payload(
    poisoned: Path, marker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_script("export").main([str(poisoned), "-o", str(tmp_path / "ct2")]) == 2
    assert "refused to open" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "ct2").exists()


def test_average_refuses_the_payload(
    good: Path, poisoned: Path, marker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "avg.ckpt"
    assert load_script("average_checkpoints").main([str(good), str(poisoned), "-o", str(out)]) == 1
    assert "refused to open" in capsys.readouterr().err
    assert not marker.exists() and not out.exists()


def test_rescore_refuses_the_payload(
    good: Path, marker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    poison(good, run / "checkpoints" / "best.ckpt", marker)
    assert load_script("rescore").main([str(run)]) == 1
    assert "refused to open" in capsys.readouterr().err
    assert not marker.exists()


def test_resume_refuses_the_payload(multi30k_dir: Path, good: Path, marker: Path, tmp_path: Path) -> None:
    corpus = write_corpus_slice(
        multi30k_dir, tmp_path / "m30k", {"train": 60, "val": 10, "test_2016_flickr": 5}
    )
    run = tmp_path / "run"
    poison(good, run / "checkpoints" / "last.ckpt", marker)
    cfg = compose_train(tiny_overrides(corpus, run, tmp_path / "cache", "trainer.max_steps=2", "resume=true"))
    with pytest.raises(CheckpointError, match=r"refused to open .*last\.ckpt"):
        train(cfg)
    assert not marker.exists()


def test_a_newer_format_is_refused_by_name(good: Path, tmp_path: Path) -> None:
    checkpoint = read_checkpoint(good)
    checkpoint[CHECKPOINT_KEY]["format_version"] = 99
    save_atomically(checkpoint, tmp_path / "future.ckpt")
    with pytest.raises(CheckpointError, match=r"future\.ckpt has checkpoint format 99.* up to 1: update"):
        read_checkpoint(tmp_path / "future.ckpt")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: c[CHECKPOINT_KEY]["config"].pop("model"), r"has no translation\.config\.model"),
        (lambda c: c[CHECKPOINT_KEY].pop("config"), r"has no translation\.config\b"),
        (lambda c: c[CHECKPOINT_KEY].update(src_spm="not bytes"), r"translation\.src_spm is a str"),
        (lambda c: c.update(state_dict=[1, 2]), r"state_dict is a list, expected a dict"),
        (
            lambda c: c[CHECKPOINT_KEY].update(format_version="one"),
            r"unknown checkpoint format_version 'one'",
        ),
    ],
    ids=["no_model_config", "no_config", "spm_not_bytes", "state_dict_list", "version_text"],
)
def test_structural_errors_name_the_missing_part(
    good: Path, tmp_path: Path, damage: Callable[[dict[str, Any]], Any], message: str
) -> None:
    checkpoint = read_checkpoint(good)
    damage(checkpoint)
    save_atomically(checkpoint, tmp_path / "broken.ckpt")
    with pytest.raises(CheckpointError, match=message) as err:
        read_checkpoint(tmp_path / "broken.ckpt")
    assert str(tmp_path / "broken.ckpt") in str(err.value)


def test_a_format_0_checkpoint_still_loads(good: Path, tmp_path: Path) -> None:
    """Written before the version number, with numpy's random state as an array (as RngState kept it):
    weights-only safe, so it opens, and the model loads."""
    checkpoint = read_checkpoint(good)
    checkpoint[CHECKPOINT_KEY].pop("format_version", None)
    checkpoint["rng_states"] = [{"numpy": np.random.get_state(), "torch": torch.get_rng_state()}]
    save_atomically(checkpoint, tmp_path / "old.ckpt")
    loaded = read_checkpoint(tmp_path / "old.ckpt")
    assert np.array_equal(loaded["rng_states"][0]["numpy"][1], np.random.get_state()[1])
    assert load_model(tmp_path / "old.ckpt").model is not None
