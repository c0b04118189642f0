"""Rollout: G sampled completions per prompt with ``generate``, scored into groups.

Every group is sampled on its own with a seed derived from (run seed, step, prompt position),
so a prompt gets the same samples whichever rank or batch it lands in: one process and two
data-parallel processes see the same rollouts, and a resumed run sees the killed run's. The
rollout engine runs in its own precision (``rollout_precision``) and in eval mode (no dropout,
no router jitter).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from moescope.models.evaluation import decode_completions
from moescope.models.tasks import Example
from moescope.replay.config import ReplayConfig
from moescope.replay.precision import autocast
from moescope.replay.rewards import RewardFn, score_all


@dataclass
class Group:
    """One prompt (or PivotRL pivot) and its G sampled continuations.

    ``prompt_ids`` are the tokens the policy was conditioned on; ``responses`` the sampled
    tokens up to and including end-of-sequence; ``truncated`` marks responses that hit the
    token budget without ending; ``prefix`` is text already fixed before sampling (a pivot's
    part of the reference answer), scored together with the completion.
    """

    example: Example
    index: int
    prompt_ids: list[int]
    responses: list[list[int]]
    completions: list[str]
    rewards: list[float]
    truncated: list[bool]
    prefix: str = ""


def sample_seed(seed: int, step: int, index: int, salt: str = "rollout") -> int:
    """The generator seed of one group: a pure function of run seed, step and prompt position."""
    return zlib.crc32(f"moescope-{salt}:{seed}:{step}:{index}".encode())


@torch.no_grad()
def sample_group(
    model: torch.nn.Module,
    tokenizer,
    prompt_ids: list[int],
    *,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    precision: str,
    seed: int,
    synced: bool = False,
) -> tuple[list[list[int]], list[bool], list[str]]:
    """Sample ``group_size`` continuations of one prompt; returns tokens, truncation flags, texts.

    ``synced``: keep running forward passes until every process has finished (a sharded model's
    layers are gathered by all processes together); the samples are the same."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids] * group_size, device=device)
    torch.manual_seed(seed)
    with autocast(precision, device):
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            synced_gpus=synced,
        )
    new = out[:, len(prompt_ids) :]
    eos = tokenizer.eos_token_id
    responses, truncated = [], []
    for row in new.tolist():
        if eos in row:
            responses.append(row[: row.index(eos) + 1])
            truncated.append(False)
        else:
            responses.append(row)
            truncated.append(True)
    return responses, truncated, decode_completions(tokenizer, new)


@dataclass(frozen=True)
class Sampler:
    """The rollout engine of a replay: the policy sampling with the run's settings, and the reward."""

    policy: torch.nn.Module
    tokenizer: Any
    reward_fn: RewardFn
    config: ReplayConfig
    max_new_tokens: int
    synced: bool = False  # a sharded policy: every process runs every generation step

    def sample(self, prompt_ids: list[int], seed: int) -> tuple[list[list[int]], list[bool], list[str]]:
        """:func:`sample_group` of ``config.group_size`` continuations of ``prompt_ids``."""
        c = self.config
        return sample_group(
            self.policy,
            self.tokenizer,
            prompt_ids,
            group_size=c.group_size,
            max_new_tokens=self.max_new_tokens,
            temperature=c.temperature,
            top_p=c.top_p,
            precision=c.rollout_dtype_name,
            seed=seed,
            synced=self.synced,
        )

    def score(self, example: Example, completions: list[str]) -> list[float]:
        """The reward of each completion of ``example``."""
        return score_all(self.reward_fn, [example] * len(completions), completions)


def rollout_groups(sampler: Sampler, examples: Sequence[tuple[int, Example]], *, step: int) -> list[Group]:
    """Sample and score one group per ``(position, example)``."""
    groups = []
    for index, ex in examples:
        prompt_ids = sampler.tokenizer(ex.prompt, add_special_tokens=True)["input_ids"]
        seed = sample_seed(sampler.config.seed, step, index)
        responses, truncated, texts = sampler.sample(prompt_ids, seed)
        groups.append(Group(ex, index, prompt_ids, responses, texts, sampler.score(ex, texts), truncated))
    return groups
