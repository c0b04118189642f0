"""A step's groups: sampled (or PivotRL pivots), rewards under the ``reward_scale`` fault,
reward statistics summed, and packed into minibatches with their group advantages."""

from __future__ import annotations

from typing import Any

import torch

from moescope.replay.advantages import advantages as group_advantages
from moescope.replay.batch import Batch, pack
from moescope.replay.config import ReplayConfig
from moescope.replay.faults import FaultPlan
from moescope.replay.pivot import pivot_groups
from moescope.replay.rollout import Group, Sampler, rollout_groups
from moescope.replay.sums import StepSums


def step_groups(
    sampler: Sampler,
    step: int,
    examples: list[Any],
    positions: list[int],
    faults: FaultPlan,
    sums: StepSums,
) -> dict[int, list[Group]]:
    """The scored groups of this rank's prompt ``positions`` of the step, by position."""
    items = [(g, examples[g]) for g in positions]
    if sampler.config.pivot:
        by_pos = pivot_groups(sampler, step, items, len(examples), sums)
    else:
        by_pos = {g.index: [g] for g in rollout_groups(sampler, items, step=step)}
    scale = faults.get("reward_scale", step)
    for gs in by_pos.values():
        for g in gs:
            if scale is not None:
                g.rewards = [r * scale.arg for r in g.rewards]
            _add_reward_sums(g, sums)
    return by_pos


def _add_reward_sums(g: Group, sums: StepSums) -> None:
    r = torch.tensor(g.rewards, dtype=torch.float64)
    sums.add("reward_sum", r.sum())
    sums.add("reward_sq", (r * r).sum())
    sums.add("samples", len(g.rewards))
    sums.add("length_sum", sum(len(x) for x in g.responses))
    sums.add("truncated", sum(g.truncated))
    sums.add("groups", 1)
    sums.add("groups_no_signal", float(r.max() == r.min()))


def pack_groups(
    by_pos: dict[int, list[Group]], positions: list[int], config: ReplayConfig, pad_token_id: int
) -> Batch:
    """One minibatch: the groups of ``positions``, each response with its group advantage."""
    groups = [g for pos in positions for g in by_pos.get(pos, [])]
    advs: list[float] = []
    for g in groups:
        rewards = torch.tensor([g.rewards])
        advs += group_advantages(rewards, gepo=config.gepo, threshold=config.difficulty_threshold)[0].tolist()
    return pack(groups, advs, pad_token_id)
