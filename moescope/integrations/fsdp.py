"""An accelerate FSDP2 launch of a 🤗 Trainer (TRL's), on GPUs as accelerate runs it and on CPU too.

``accelerate launch --config_file examples/accelerate_fsdp2.yaml`` (``fsdp_version: 2``) makes
the Trainer wrap each decoder layer and the root with ``fully_shard`` when training starts.
accelerate honours an FSDP config only on accelerators: on a machine without one it quietly
trains data parallel, every process holding the whole model. :func:`shard_on_cpu` closes that
gap, so the same config shards CPU processes over gloo (how the tests, and a laptop, run it):

- the Trainer's accelerate state is set to FSDP, with the plugin the launch's ``FSDP_*``
  variables describe, before training prepares the model;
- gloo has no averaging reduction (``AVG``, ``PREMUL_SUM``), so once the model is sharded its
  gradient reductions are forced to sums, divided by the world size around the collective: the
  same average FSDP2 takes on GPUs.

Where the launch is not FSDP2, or runs on GPUs, it leaves the Trainer as it is: call it always.

:func:`check_sharding` refuses, in one sentence, a sharded model the instruments cannot read
right: FSDP1's flattened parameters, a device mesh of more than one dimension (hybrid sharding,
tensor parallel), whose replicated shards a sum over ranks would count twice, and an FSDP2
launch on CPU that was left data parallel (``shard_on_cpu`` not called).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import TrainerCallback

from moescope.errors import MoescopeError
from moescope.models.sharding import is_sharded, is_sharded_model

__all__ = ["check_sharding", "fsdp_launch", "shard_on_cpu"]


def fsdp_launch() -> bool:
    """Whether this process was started by ``accelerate launch`` with an FSDP2 config."""
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
    return fsdp and os.environ.get("FSDP_VERSION") == "2"


def shard_on_cpu(trainer: Any) -> Any:
    """Make ``trainer`` (built, not yet trained) shard under an FSDP2 launch on CPU as it would on
    GPUs; returns it. Elsewhere it is returned unchanged."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if not fsdp_launch() or state.distributed_type != DistributedType.MULTI_CPU:
        return trainer
    plugin = FullyShardedDataParallelPlugin()  # from the launch's FSDP_* variables
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)  # as accelerate does on GPUs
    state.fsdp_plugin = plugin
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
    trainer.add_callback(_SumReductions())
    return trainer


class _SumReductions(TrainerCallback):
    """Sum-only gradient reductions on the sharded model (gloo has no average)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules() if isinstance(model, torch.nn.Module) else ():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)


def check_sharding(model: torch.nn.Module) -> None:
    """Refuse a sharded ``model`` whose gradients the instruments cannot sum right over ranks."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise MoescopeError(
            "moescope's instruments read FSDP2 shards, and this model is wrapped by FSDP1 (flattened "
            "parameters); set fsdp_version: 2 in the accelerate config (examples/accelerate_fsdp2.yaml)."
        )
    world = _world_size()
    if fsdp_launch() and world > 1 and not is_sharded_model(model):
        raise MoescopeError(
            "this accelerate FSDP2 launch left the whole model on every process (accelerate shards "
            "only on accelerators: on CPU it trains data parallel); call "
            "moescope.integrations.fsdp.shard_on_cpu(trainer) before training, or add the callback "
            "with moescope.integrations.trl.instrument, which does."
        )
    for name, param in model.named_parameters():
        mesh = param.device_mesh if is_sharded(param) else None
        if mesh is not None and (mesh.ndim != 1 or mesh.size() != world):
            raise MoescopeError(
                f"{name} is sharded over a {mesh.ndim}-dimensional mesh of {mesh.size()} of {world} "
                "processes (hybrid sharding or tensor parallel), whose gradient norms a sum over every "
                "process would miscount; shard with plain FSDP2 over all processes, or drop the callback."
            )


def _world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
