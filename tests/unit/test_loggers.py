"""app.training.loggers.wandb_mode: online only with a key, found without contacting W&B or prompting."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.training.loggers import wandb_mode

KEY = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def no_wandb_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No W&B variables and an empty home: the netrc the tests write is the only credential."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def write_netrc(path: Path, host: str) -> Path:
    path.write_text(f"machine {host}\n  login user\n  password {KEY}\n")
    path.chmod(0o600)  # netrc refuses a password file that others can read
    return path


def test_no_key_anywhere_means_offline(no_wandb_env: Path) -> None:
    assert wandb_mode() == "offline"


def test_an_explicit_mode_wins(no_wandb_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"


def test_the_environment_key_means_online(no_wandb_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    assert wandb_mode() == "online"


def test_wandb_login_netrc_entry_means_online(no_wandb_env: Path) -> None:
    write_netrc(no_wandb_env / ".netrc", "api.wandb.ai")
    assert wandb_mode() == "online"


def test_the_netrc_entry_must_be_for_the_configured_host(
    no_wandb_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NETRC", str(write_netrc(no_wandb_env / "other.netrc", "wandb.example.org")))
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert wandb_mode() == "online"
