"""Opening a checkpoint never runs code from it: a real pickle payload (an object whose ``__reduce__``
creates a marker file) is refused, with no side effect, by every program that opens checkpoints --
translate.py, the server (and its --ensemble), export, averaging, rescore and train.py's resume, with
every training strategy (FSDP, DDP)."""

from __future__ import annotations

import builtins
import importlib.util
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import uvicorn
from helpers.training import REPO_ROOT, compose_train, run_translate, tiny_overrides, write_corpus_slice
from lightning_fabric.strategies.fsdp import _get_full_state_dict_context
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy
from pytorch_lightning.trainer.states import TrainerFn
from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

from app.checkpoint import CHECKPOINT_KEY, CheckpointError, load_model, read_checkpoint, save_atomically
from app.data.tokenizer import Tokenizer
from app.training.module import TranslationModule
from app.training.strategies import WeightsOnlyFSDPStrategy, weights_only_strategy
from app.training.task import build_trainer, train

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
def good(tiny_checkpoint: Path) -> Path:
    """The checkpoint the crafted files start from (tests/integration/conftest.py)."""
    return tiny_checkpoint


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
    assert load_script("average_checkpoints").main([str(good), str(poisoned), "-o", str(out)]) == 2
    assert "refused to open" in capsys.readouterr().err
    assert not marker.exists() and not out.exists()


def test_rescore_refuses_the_payload(
    good: Path, marker: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    poison(good, run / "checkpoints" / "best.ckpt", marker)
    assert load_script("rescore").main([str(run)]) == 2
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


def test_fsdp_resume_reads_weights_only(poisoned: Path, marker: Path) -> None:
    """``trainer=fsdp``: Lightning's FSDPStrategy reads a resumed file with an unrestricted unpickler.
    The strategy our config builds reads it weights-only (FSDP needs a GPU, so its ``load_checkpoint``,
    the step ``trainer.fit(ckpt_path=...)`` takes, is called directly)."""
    strategy = weights_only_strategy(compose_train(["trainer=fsdp"]).trainer.strategy)
    assert isinstance(strategy, FSDPStrategy)
    with pytest.raises(CheckpointError, match=r"refused to open .*poisoned\.ckpt.*GLOBAL io\.open"):
        strategy.load_checkpoint(poisoned)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="a sharded FSDP checkpoint"):  # torch.distributed.checkpoint's
        strategy.load_checkpoint(poisoned.parent)  # metadata is a plain pickle: directories are refused


def test_ddp_resume_reads_weights_only(poisoned: Path, marker: Path, tmp_path: Path) -> None:
    cfg = compose_train(["trainer=ddp_cpu"])
    trainer = build_trainer(cfg, tmp_path / "run")
    assert isinstance(trainer.strategy, DDPStrategy)
    with pytest.raises(CheckpointError, match=r"refused to open .*poisoned\.ckpt"):
        trainer.strategy.load_checkpoint(poisoned)
    assert not marker.exists()


def test_strategies_with_their_own_unpickler_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"trainer\.strategy=deepspeed .*own unpickler.*valid choices: auto, ddp"
    ):
        weights_only_strategy("deepspeed")
    assert weights_only_strategy("ddp") == "ddp"


class SystemCall:
    """A payload that calls ``os.system``, the README's example of what a pickle could run."""

    def __init__(self, marker: Path) -> None:
        self.command = f"touch {marker}"

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str]]:
        return os.system, (self.command,)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
@pytest.mark.parametrize(
    "write",
    [
        lambda obj, path: path.write_bytes(pickle.dumps(obj, protocol=4)),
        lambda obj, path: torch.save(obj, path, pickle_protocol=4),
        lambda obj, path: torch.save(obj, path),
    ],
    ids=["raw_pickle", "torch_zip_protocol_4", "torch_zip"],
)
def test_a_system_call_is_named_as_code(
    write: Callable[[Any, Path], Any], marker: Path, tmp_path: Path
) -> None:
    """Not "truncated or not a checkpoint": protocols 3-5 stop torch's unpickler at its first opcode,
    so the refusal reads the file's opcodes (without running them) to name what it asked for."""
    path = tmp_path / "payload.ckpt"
    write({"state_dict": {}, "note": SystemCall(marker)}, path)
    with pytest.raises(CheckpointError, match=rf"GLOBAL {os.system.__module__}\.system\).*could run code"):
        read_checkpoint(path)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
@pytest.mark.filterwarnings("ignore:When using ``NO_SHARD``")
@pytest.mark.filterwarnings("ignore:FSDP.state_dict_type:FutureWarning")
def test_fsdp_resume_restores_weights_and_optimizer(
    good: Path,
    spm_tokenizer: Tokenizer,
    make_transformer: Callable[..., torch.nn.Module],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The weights-only FSDP resume still loads what Lightning's FSDP saves (full model and optimizer
    states), into a real FSDP module on CPU (gloo, one process; Lightning itself runs FSDP on GPUs only,
    so the trainer is a stand-in holding the state the strategy reads)."""
    model = make_transformer(src_vocab_size=spm_tokenizer.vocab_size, tgt_vocab_size=spm_tokenizer.vocab_size)
    module = TranslationModule(
        model=model, src_tokenizer=spm_tokenizer, tgt_tokenizer=spm_tokenizer, config={}
    )
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        root = FullyShardedDataParallel(module, device_id=torch.device("cpu"), use_orig_params=True)
        trained = torch.optim.AdamW(root.parameters())
        root(torch.tensor([[5, 6, 7, 3]]), torch.tensor([[2, 9, 10]])).square().mean().backward()
        trained.step()
        with _get_full_state_dict_context(root, world_size=1, rank0_only=False):
            weights = {name: value.clone() for name, value in root.state_dict().items()}
            optimizer_state = FullyShardedDataParallel.rekey_optim_state_dict(
                FullyShardedDataParallel.optim_state_dict(root, trained), OptimStateKeyType.PARAM_ID, root
            )
        payload = read_checkpoint(good)[CHECKPOINT_KEY]
        save_atomically(
            {"state_dict": weights, "optimizer_states": [optimizer_state], CHECKPOINT_KEY: payload},
            tmp_path / "last.ckpt",
        )
        with torch.no_grad():  # what a restart has: other weights, an optimizer without state
            for parameter in root.parameters():
                parameter.add_(1.0)
        fresh = torch.optim.AdamW(root.parameters())
        strategy = WeightsOnlyFSDPStrategy()
        strategy.connect(module)
        strategy.model, strategy.optimizers = root, [fresh]
        monkeypatch.setattr(module, "_trainer", SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING)))
        strategy.load_checkpoint(tmp_path / "last.ckpt")
        with _get_full_state_dict_context(root, world_size=1, rank0_only=False):
            for name, value in root.state_dict().items():
                assert torch.equal(value, weights[name]), name
        restored, saved = fresh.state_dict()["state"], trained.state_dict()["state"]
        assert len(restored) == len(saved) > 0
        for mine, theirs in zip(restored.values(), saved.values(), strict=True):
            assert torch.equal(mine["exp_avg"], theirs["exp_avg"]) and mine["step"] == theirs["step"]
    finally:
        dist.destroy_process_group()
