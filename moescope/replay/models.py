"""The models of a replay: the policy, its frozen reference, the tokenizer, the MoE view, the loop count."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from moescope.errors import MoescopeError
from moescope.models.looping import apply_loop, loop_times_of
from moescope.models.sharding import fill_from_rank0, rank0_state, shard_model
from moescope.models.view import MoEModel, adapt
from moescope.replay.config import ReplayConfig


@dataclass
class Models:
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    tokenizer: Any
    moe: MoEModel
    loop_times: int


def prepare_models(
    policy: torch.nn.Module, reference: torch.nn.Module | None, tokenizer: Any, loop_times: int
) -> Models:
    """Adapt (before looping, so hooks sit once per physical layer), loop, set eval mode."""
    moe = adapt(policy)
    for m in (policy, reference):
        if m is not None:
            if loop_times > 1:
                apply_loop(m, loop_times)
            m.eval()  # deterministic routing, no dropout; gradients still flow
    if reference is not None:
        reference.requires_grad_(False)
    if tokenizer is None:
        raise MoescopeError(
            "Replay needs a tokenizer to sample text; pass tokenizer= or a checkpoint that ships one."
        )
    return Models(policy, reference, tokenizer, moe, loop_times)


def shard_models(models: Models, *, reference_is_policy: bool) -> None:
    """Shard the policy (trained) and the reference (frozen) over the processes with FSDP2, each
    filled from rank 0's copy (the reference from the policy's when it is the policy as it
    starts), so that no other process ever holds a whole model."""
    policy_state = rank0_state(models.policy)
    shard_model(models.policy)
    fill_from_rank0(models.policy, policy_state)
    if models.reference is not None:
        reference_state = policy_state if reference_is_policy else rank0_state(models.reference)
        del policy_state
        shard_model(models.reference, train=False)
        fill_from_rank0(models.reference, reference_state)


def reference_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen deep copy of the policy (the reference when no ``ref_model_path`` is given)."""
    ref = copy.deepcopy(policy)
    ref.requires_grad_(False)
    return ref


def model_loop_times(config: ReplayConfig, model_config: Any) -> int:
    """The loop count of the replay: the config's, else the model's own."""
    return config.loop_times or loop_times_of(model_config)
