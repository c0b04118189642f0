"""Sharding a model with PyTorch FSDP2 (``fully_shard``), and reading what a sharded model holds.

Every training-shaped stage (the replay, healing, the TRL callback) trains models that one device
cannot hold, so each decoder layer is wrapped with ``fully_shard`` and the root once more: a rank
keeps 1/N of every parameter, gradient and optimizer moment, and a layer is gathered whole only
while it runs. Parameters and gradients become ``DTensor`` shards; the helpers here give the
instruments what they need from them — a gradient's local part, sums over the shard group — so
the MoE figures of a sharded run equal an unsharded run's.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from moescope.errors import MoescopeError
from moescope.models.looping import loop_times_of
from moescope.models.view import decoder_layers

try:  # DTensor is in every torch this package supports; the guard keeps imports cheap to reason about
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch builds without distributed
    DTensor = None  # type: ignore[assignment,misc]


def is_sharded(tensor: torch.Tensor | None) -> bool:
    """Whether ``tensor`` is a DTensor (a parameter or gradient of a ``fully_shard`` module)."""
    return DTensor is not None and isinstance(tensor, DTensor)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor`` (the tensor itself when it is not sharded)."""
    return tensor.to_local() if is_sharded(tensor) else tensor


def any_sharded(params: Iterable[torch.nn.Parameter]) -> bool:
    """Whether any of ``params`` is a shard: then sums over them need a collective."""
    return any(is_sharded(p) for p in params)


def sum_over_shards(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over the default process group in place (a no-op in one process).

    For per-rank partial sums of sharded values, such as squared gradient norms: each rank holds
    a disjoint slice, so the sum over ranks is the figure of the whole tensor."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def shard_model(
    model: torch.nn.Module, *, reshard_after_forward: bool = True, train: bool = True
) -> torch.nn.Module:
    """Wrap each decoder layer and the root of ``model`` with FSDP2 ``fully_shard``, in place.

    Needs a process group (``torchrun`` makes one). Gradients are *summed* over ranks, not
    averaged (``set_gradient_divide_factor(1)``): moescope's losses are already normalised by the
    global token count, so the sum is the one-process gradient. A model that runs a layer more
    than once per forward (a looped MoE) is sharded at the root only, since a layer's gradient
    must be reduced once per backward. ``train=False`` (a frozen reference, a teacher) keeps the
    same sharding with no gradients."""
    if not (dist.is_available() and dist.is_initialized()):
        raise MoescopeError(
            "Sharding needs a process group: launch with torchrun (e.g. `torchrun --nproc-per-node 2 "
            "-m moescope ...`) or accelerate, or drop --shard."
        )
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not train:
        model.requires_grad_(False)
    if getattr(model, "_moescope_looped", 1) == 1 and loop_times_of(model.config) == 1:
        for layer in decoder_layers(model):
            fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):  # each wrapped module reduces its own gradients
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


def is_sharded_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` was wrapped by :func:`shard_model` (or any FSDP2 ``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
