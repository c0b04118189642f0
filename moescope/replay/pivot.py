"""PivotRL: local RL updates from the informative middle of reference trajectories.

The deployment guide's PivotRL samples *intermediate steps* of reference (SFT) trajectories —
for the toy, the correct answers; for a prompt file, its answers — and learns only where the
outcome is genuinely uncertain:

1. per step, ``sample_steps`` pivots are drawn, spread evenly over the step's prompts: a pivot
   is the prompt plus the first ``j`` tokens of the reference answer (``j`` drawn with the seed);
2. G continuations are sampled from each pivot and scored as ``answer[:j] + continuation``;
3. a pivot is kept when its reward variance reaches ``variance_threshold`` (0.15 by default: a
   0/1 reward between roughly 19 % and 81 % right) — all-right and all-wrong pivots carry no
   gradient and are dropped;
4. among the kept pivots of a prompt the hardest (lowest mean reward) are preferred: at most
   ``pivot_keep`` of them (default: half the prompt's pivots, at least one);
5. the kept pivots form the GRPO groups of the update, which therefore touches only the
   continuation tokens after each pivot.

The trace records ``pivot/sampled`` and ``pivot/kept`` per step.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

from moescope.replay.rollout import Group, Sampler, sample_seed
from moescope.replay.sums import StepSums


def pivot_positions(answer_len: int, n: int, rng: random.Random) -> list[int]:
    """``n`` distinct prefix lengths in ``[0, answer_len)`` (all of them when fewer exist), sorted."""
    choices = list(range(answer_len))
    return sorted(rng.sample(choices, min(n, len(choices))))


def pivot_groups(
    sampler: Sampler, step: int, items: list[tuple[int, Any]], prompts: int, sums: StepSums
) -> dict[int, list[Group]]:
    """Sampled, scored and filtered pivot groups for this rank's prompts, by prompt position.

    ``prompts`` is the number of prompts of the step over all ranks: the ``sample_steps``
    pivots are spread over them.
    """
    c = sampler.config
    per_prompt = max(1, math.ceil(c.sample_steps / prompts))
    keep_at_most = c.pivot_keep or max(1, per_prompt // 2)
    out: dict[int, list[Group]] = {}
    for g, ex in items:
        candidates = _informative_pivots(sampler, step, g, ex, per_prompt, sums)
        candidates.sort(key=lambda grp: (sum(grp.rewards) / len(grp.rewards), len(grp.prefix)))
        kept = candidates[:keep_at_most]
        sums.add("pivot_kept", len(kept))
        out[g] = kept
    return out


def _informative_pivots(
    sampler: Sampler, step: int, g: int, ex: Any, per_prompt: int, sums: StepSums
) -> list[Group]:
    """The pivots of prompt ``g`` whose reward variance reaches ``variance_threshold``."""
    c, tok = sampler.config, sampler.tokenizer
    prompt_ids = tok(ex.prompt, add_special_tokens=True)["input_ids"]
    answer_ids = tok(ex.answer, add_special_tokens=False)["input_ids"]
    rng = random.Random(sample_seed(c.seed, step, g, "pivot-positions"))
    candidates = []
    for j in pivot_positions(len(answer_ids), per_prompt, rng):
        prefix_ids = prompt_ids + answer_ids[:j]
        prefix = tok.decode(answer_ids[:j], skip_special_tokens=False)
        seed = sample_seed(c.seed, step, g * 4096 + j, "pivot")
        responses, truncated, texts = sampler.sample(prefix_ids, seed)
        rewards = sampler.score(ex, [prefix + t for t in texts])
        sums.add("pivot_sampled", 1)
        variance = float(torch.tensor(rewards).var(unbiased=False))
        if variance >= c.variance_threshold:
            candidates.append(Group(ex, g, prefix_ids, responses, texts, rewards, truncated, prefix))
    return candidates
