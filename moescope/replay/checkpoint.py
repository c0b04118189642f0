"""Replay checkpoints: everything a killed run needs to continue exactly where it stopped.

``TRACE.ckpt/`` beside the trace holds the policy's parameters (safetensors), the AdamW state
(``torch.save``, read back with ``weights_only=True``) and ``state.json`` (the next step, the
config digest, loss-scaler and OPEFO state). It is written to a temporary sibling and renamed,
so a kill during the write leaves the previous checkpoint whole. The LR schedule, the data
schedule and the sampling seeds are functions of the step, so they need no saving.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from moescope.errors import MoescopeError

STATE = "state.json"
WEIGHTS = "policy.safetensors"
OPTIMIZER = "optimizer.pt"


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
) -> Path:
    final = checkpoint_dir(trace_path)
    work = final.with_name(final.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    save_file(unique_parameters(model), str(work / WEIGHTS))
    torch.save(optimizer.state_dict(), work / OPTIMIZER)
    (work / STATE).write_text(json.dumps(state, indent=1) + "\n")
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(work, final)
    shutil.rmtree(old, ignore_errors=True)
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


def load_checkpoint(trace_path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    folder = checkpoint_dir(trace_path)
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
