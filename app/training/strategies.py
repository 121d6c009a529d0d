"""Training strategies that read checkpoints only through :func:`app.checkpoint.read_checkpoint`.

Lightning's strategies read a resumed checkpoint in ``Strategy.load_checkpoint``. The plain ones (single
device, DDP) hand the file to the trainer's checkpoint I/O, :class:`AtomicCheckpointIO`, which opens it
weights-only. FSDP does not: ``FSDPStrategy.load_checkpoint`` opens a full checkpoint with
``lightning_fabric``'s lazy loader, an unrestricted unpickler, so ``trainer=fsdp resume=...`` would run
whatever a pickled object in the file asks for. :class:`WeightsOnlyFSDPStrategy` reads the file through
the checkpoint I/O and then loads it into the sharded model and optimizers the way Lightning does.
DeepSpeed (and any other strategy with its own reader) is refused by :func:`weights_only_strategy`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_fabric.strategies.fsdp import _get_full_state_dict_context
from lightning_fabric.strategies.model_parallel import _load_raw_module_state
from pytorch_lightning.strategies import FSDPStrategy, Strategy, StrategyRegistry
from pytorch_lightning.trainer.states import TrainerFn

from app.checkpoint import CheckpointError
from app.errors import ConfigError
from app.training.checkpoint_io import AtomicCheckpointIO


class WeightsOnlyFSDPStrategy(FSDPStrategy):
    """FSDP whose resume reads one full checkpoint file weights-only (the files train.py writes).

    A directory (a sharded checkpoint, whose metadata ``torch.distributed.checkpoint`` unpickles) is
    refused: this toolkit writes full checkpoints (``state_dict_type="full"``, Lightning's default).
    """

    def __init__(self, **options: Any) -> None:
        options.setdefault("checkpoint_io", AtomicCheckpointIO())
        super().__init__(**options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(self.broadcast(checkpoint_path))
        if path.is_dir():
            raise CheckpointError(
                f"{path} is a directory (a sharded FSDP checkpoint?): resume reads only the single-file "
                "checkpoints train.py writes"
            )
        checkpoint = AtomicCheckpointIO().load_checkpoint(path)  # weights-only, whatever checkpoint_io is set
        assert self.model is not None and self.lightning_module is not None
        _load_raw_module_state(
            checkpoint.pop("state_dict"),
            module=self.model,
            world_size=self.world_size,
            strict=self.lightning_module.strict_loading,
        )
        states = checkpoint.get("optimizer_states")
        if states is not None and self.lightning_module.trainer.state.fn == TrainerFn.FITTING:
            self._load_full_optimizer_states(states)
        return checkpoint

    def _load_full_optimizer_states(self, states: list[dict[str, Any]]) -> None:
        """Load full (unsharded) optimizer states into the sharded optimizers, on every rank."""
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        if len(states) != len(self.optimizers):
            raise CheckpointError(
                f"the checkpoint holds {len(states)} optimizer states, this run has {len(self.optimizers)}"
            )
        with _get_full_state_dict_context(self.model, world_size=self.world_size, rank0_only=False):
            for optimizer, state in zip(self.optimizers, states, strict=True):
                if state["state"] and isinstance(next(iter(state["state"])), int):  # keyed by id: rekey
                    state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_NAME, self.model)
                state = FSDP.optim_state_dict_to_load(
                    optim_state_dict=state, model=self.model, optim=optimizer
                )
                optimizer.load_state_dict(state)


def _reads_through_checkpoint_io(name: str) -> bool:
    """Whether Lightning's strategy ``name`` reads checkpoints through the trainer's checkpoint I/O."""
    return StrategyRegistry[name]["strategy"].load_checkpoint is Strategy.load_checkpoint


def weights_only_strategy(strategy: Any) -> Any:
    """``trainer.strategy`` as the Trainer should get it: FSDP names (``fsdp``, ``fsdp_cpu_offload``)
    become a :class:`WeightsOnlyFSDPStrategy` with the same settings, names whose strategy reads through
    the checkpoint I/O (``auto``, ``ddp*``, ``single_device``) stay, and any other (``deepspeed*``,
    whose reader unpickles freely) is refused with a ValueError naming the valid choices."""
    if not isinstance(strategy, str) or strategy == "auto" or strategy not in StrategyRegistry:
        return strategy  # an instance, or a name Lightning itself will refuse
    entry = StrategyRegistry[strategy]
    if issubclass(entry["strategy"], FSDPStrategy):
        return WeightsOnlyFSDPStrategy(**entry["init_params"])
    if _reads_through_checkpoint_io(strategy):
        return strategy
    valid = ["auto"] + [
        name
        for name in StrategyRegistry.available_strategies()
        if issubclass(StrategyRegistry[name]["strategy"], FSDPStrategy) or _reads_through_checkpoint_io(name)
    ]
    raise ConfigError(
        f"trainer.strategy={strategy} reads checkpoints with its own unpickler, which could run code "
        f"from a file; valid choices: {', '.join(valid)}"
    )
