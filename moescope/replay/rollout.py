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

import torch

from moescope.models.evaluation import decode_completions
from moescope.models.tasks import Example
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
) -> tuple[list[list[int]], list[bool], list[str]]:
    """Sample ``group_size`` continuations of one prompt; returns tokens, truncation flags, texts."""
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


def rollout_groups(
    model: torch.nn.Module,
    tokenizer,
    examples: Sequence[tuple[int, Example]],
    reward_fn: RewardFn,
    *,
    step: int,
    seed: int,
    group_size: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    precision: str,
) -> list[Group]:
    """Sample and score one group per ``(position, example)``."""
    groups = []
    for index, ex in examples:
        prompt_ids = tokenizer(ex.prompt, add_special_tokens=True)["input_ids"]
        responses, truncated, texts = sample_group(
            model,
            tokenizer,
            prompt_ids,
            group_size=group_size,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            precision=precision,
            seed=sample_seed(seed, step, index),
        )
        rewards = score_all(reward_fn, [ex] * group_size, texts)
        groups.append(Group(ex, index, prompt_ids, responses, texts, rewards, truncated))
    return groups
