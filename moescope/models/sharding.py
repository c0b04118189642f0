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
from pathlib import Path
from typing import Any

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
    return all_reduce_(tensor)


def all_reduce_(tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """All-reduce ``tensor`` in place over the default process group (a no-op in one process),
    wherever it lives: NCCL serves accelerator tensors only, so a CPU tensor (a metric's sums)
    travels through the current accelerator and back; gloo reduces it where it is."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return tensor
    backend = str(dist.get_backend()).lower()
    if tensor.device.type == "cpu" and "gloo" not in backend and "mpi" not in backend:
        moved = tensor.to(torch.accelerator.current_accelerator())
        dist.all_reduce(moved, op=op)
        return tensor.copy_(moved)
    dist.all_reduce(tensor, op=op)
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


# --- loading on rank 0 only ------------------------------------------------------------------------


def load_for_sharding(
    model: str | Path, *, dtype: Any = None, with_tokenizer: bool = True
) -> tuple[torch.nn.Module, Any]:
    """``model`` read from its checkpoint by rank 0 only; the other processes build the same
    model on the meta device (no memory), to be sharded and then filled from rank 0
    (:func:`fill_from_rank0`). So a sharded run reads the checkpoint once, into one process's
    memory, not once per process. ``dtype`` as :func:`~moescope.models.loading.load_model`'s."""
    from moescope.models.layer_weights import meta_model, resolve_dtype
    from moescope.models.loading import load_config, load_model, load_tokenizer, resolve_model, weight_files

    source = resolve_model(model)
    if _rank() == 0:
        loaded, tokenizer = load_model(source, dtype=dtype, with_tokenizer=with_tokenizer)
    else:
        config = load_config(source)
        loaded = meta_model(config, resolve_dtype(dtype, config, weight_files(source))).eval()
        tokenizer = load_tokenizer(source) if with_tokenizer else None
    match_dtypes(loaded)
    return loaded, tokenizer


def meta_twin(model: torch.nn.Module) -> torch.nn.Module:
    """An empty copy of ``model`` on the meta device, in its dtypes (a frozen reference to be
    filled from rank 0's copy of the policy, at no memory on any process until then)."""
    from moescope.models.layer_weights import meta_model

    twin = meta_model(model.config, next(model.parameters()).dtype).eval()
    match_dtypes(twin, like=model)
    return twin


def match_dtypes(model: torch.nn.Module, like: torch.nn.Module | None = None) -> None:
    """Give ``model`` the dtype of each tensor of rank 0's model (or of ``like``): a checkpoint
    keeps some modules in float32 (transformers' ``_keep_in_fp32_modules``) that a model built
    from its config alone would not."""
    source = like if like is not None else model
    dtypes = (
        {name: str(t.dtype) for name, t in _tensors(source)} if like is not None or _rank() == 0 else None
    )
    if like is None:
        dtypes = from_rank0(dtypes)
    for name, tensor in _tensors(model):
        wanted = getattr(torch, dtypes[name].removeprefix("torch.")) if dtypes and name in dtypes else None
        if wanted is not None and tensor.dtype != wanted:
            tensor.data = tensor.data.to(wanted)


def rank0_state(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """Rank 0's whole state (parameters and every buffer, by name), taken before sharding frees
    it; ``None`` on the other processes."""
    return dict(_tensors(model)) if _rank() == 0 else None


def fill_from_rank0(model: torch.nn.Module, state: dict[str, torch.Tensor] | None) -> None:
    """Fill a sharded ``model`` from rank 0's ``state``: each process receives only its shards
    (``broadcast_from_rank0``); buffers, which are not sharded, are broadcast whole. A model still
    on the meta device is given memory first."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(local(t).is_meta for _, t in _tensors(model)):
        model.to_empty(device=_collective_device())
    params = {name for name, _ in model.named_parameters()}
    weights = {n: t for n, t in (state or {}).items() if n in params}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    set_model_state_dict(model, weights, options=options)
    for name, buffer in model.named_buffers():
        if state is not None:
            buffer.copy_(state[name])
        if _world() > 1:
            dist.broadcast(buffer, src=0)


def _collective_device() -> torch.device:
    """Where a sharded model lives: the current accelerator under NCCL (one a process), else the CPU."""
    backend = str(dist.get_backend()).lower() if dist.is_available() and dist.is_initialized() else "gloo"
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    return torch.accelerator.current_accelerator()


def from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` (any picklable object) on every process; ``value`` in one process."""
    if _world() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every process (a no-op in one process)."""
    if _world() > 1:
        dist.barrier()


def _tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
