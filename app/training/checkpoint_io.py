"""Lightning checkpoint I/O: atomic writes (:func:`app.checkpoint.save_atomically`) and clear read errors."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.plugins import TorchCheckpointIO

from app.checkpoint import read_checkpoint, save_atomically


class AtomicCheckpointIO(TorchCheckpointIO):
    """Never leaves a partial checkpoint behind, even when training is killed mid-write; a resume from
    a missing, truncated or foreign file fails with :class:`app.checkpoint.CheckpointError` naming it,
    not with a traceback from deep inside ``torch.load``. Reading is always weights-only, whatever
    ``weights_only`` Lightning passes: a checkpoint that would need more is refused
    (:func:`app.checkpoint.read_checkpoint`); everything Lightning and this project's callbacks store
    (loops, optimizer and scheduler states, callback states, random states) is plain data."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        save_atomically(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict:
        return read_checkpoint(path)
