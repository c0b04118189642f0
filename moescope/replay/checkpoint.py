"""Replay checkpoints: everything a killed run needs to continue exactly where it stopped.

``TRACE.ckpt/`` beside the trace holds the policy's parameters (safetensors), the AdamW state
(``torch.save``, read back with ``weights_only=True``) and ``state.json`` (the next step, the
config digest, loss-scaler and OPEFO state). A sharded run (FSDP2) writes its parameters and
optimizer state as a distributed checkpoint instead (``sharded/``, each process its own shards,
:mod:`torch.distributed.checkpoint`), which a run with another number of processes can read
back resharded. It is written to a temporary sibling and renamed, so a kill during the write
leaves the previous checkpoint whole. The LR schedule, the data
schedule and the sampling seeds are functions of the step, so they need no saving.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from moescope.errors import MoescopeError
from moescope.replay.comm import Comm

STATE = "state.json"
WEIGHTS = "policy.safetensors"
OPTIMIZER = "optimizer.pt"
SHARDED = "sharded"


def checkpoint_dir(trace_path: str | Path) -> Path:
    path = Path(trace_path)
    return path.with_name(path.name + ".ckpt")


def unique_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Each parameter once (a looped model repeats its layers), by its first name."""
    return {name: p.detach().contiguous() for name, p in model.named_parameters()}


def save_checkpoint(
    trace_path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    comm: Comm | None = None,
) -> Path:
    """Write the checkpoint (every process calls this; rank 0 alone writes an unsharded one)."""
    comm = comm or Comm()
    final = checkpoint_dir(trace_path)
    work = final.with_name(final.name + ".tmp")
    if comm.is_main:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    if comm.sharded:
        comm.barrier()  # the folder exists before any process writes its shards
        dcp.save(_sharded_state(model, optimizer), checkpoint_id=str(work / SHARDED))
    elif comm.is_main:
        save_file(unique_parameters(model), str(work / WEIGHTS))
        torch.save(optimizer.state_dict(), work / OPTIMIZER)
    comm.barrier()
    if comm.is_main:
        (work / STATE).write_text(json.dumps({**state, "world_size": comm.world}, indent=1) + "\n")
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(work, final)
        shutil.rmtree(old, ignore_errors=True)
    comm.barrier()
    return final


def read_state(trace_path: str | Path) -> dict[str, Any] | None:
    """The checkpoint's ``state.json``, or ``None`` when there is no checkpoint."""
    path = checkpoint_dir(trace_path) / STATE
    if not path.is_file():
        old = path.parent.with_name(path.parent.name + ".old") / STATE  # killed between renames
        if not old.is_file():
            return None
        os.replace(old.parent, path.parent)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        raise MoescopeError(
            f"Checkpoint state {path} is corrupted; delete {path.parent} and replay from the start."
        ) from None


def load_checkpoint(
    trace_path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    comm: Comm | None = None,
) -> None:
    folder = checkpoint_dir(trace_path)
    if (comm or Comm()).sharded:
        _load_sharded(folder, model, optimizer)
        return
    if not (folder / WEIGHTS).is_file():
        raise MoescopeError(
            f"Checkpoint {folder} holds sharded state; resume it with --shard fsdp under torchrun."
        )
    weights = load_file(str(folder / WEIGHTS))
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(weights))
    if missing:
        raise MoescopeError(
            f"Checkpoint {folder} was written for another model (no {missing[0]}); "
            "resume with the same model."
        )
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
    optimizer.load_state_dict(torch.load(folder / OPTIMIZER, weights_only=True))


def _sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and optimizer's state as DTensor shards, keyed by parameter name."""
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def _load_sharded(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read a distributed checkpoint into a sharded model and its optimizer (resharded when it
    was written by another number of processes)."""
    if not (folder / SHARDED).is_dir():
        raise MoescopeError(
            f"Checkpoint {folder} was written by an unsharded replay; resume it without --shard fsdp."
        )
    state = _sharded_state(model, optimizer)
    try:
        dcp.load(state, checkpoint_id=str(folder / SHARDED))
    except Exception as exc:  # a missing key or shard: another model, or a damaged checkpoint
        raise MoescopeError(
            f"Cannot read the sharded checkpoint {folder} ({type(exc).__name__}); resume with the "
            "model it was written for, or delete it and replay from the start."
        ) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
