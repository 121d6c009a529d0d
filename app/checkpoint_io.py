"""Lightning checkpoint I/O that writes atomically (see :func:`app.checkpoint.save_atomically`)."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.plugins import TorchCheckpointIO

from app.checkpoint import save_atomically


class AtomicCheckpointIO(TorchCheckpointIO):
    """Never leaves a partial checkpoint behind, even when training is killed mid-write."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        save_atomically(checkpoint, path)
