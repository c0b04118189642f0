r"""Group-relative advantages: GRPO, and GEPO's entropy-weighted asymmetric correction.

GRPO
    For a group of G samples of one prompt with rewards :math:`r_1..r_G`,
    :math:`A_i = (r_i - \mu) / (\sigma + \epsilon)` with the group mean and (unbiased) standard
    deviation, as in verl. A group whose rewards are all equal gets :math:`A_i = 0`.

GEPO (group-entropy policy optimisation, the deployment guide's ``use_gepo``)
    Std-normalisation gives every group the same total push whatever its reward variance, so a
    nearly solved group (7 of 8 right) pushes its seven right answers as hard as a 50/50 group,
    and a nearly hopeless group punishes its seven failures as hard. GEPO rescales by the group's
    difficulty and reward entropy, asymmetrically:

    - success rate :math:`p = \mathrm{clip}(\mu, 0, 1)` (rewards are read on a 0..1 scale),
      difficulty :math:`d = 1 - p`, reward entropy
      :math:`H = -(p \ln p + (1-p) \ln (1-p)) / \ln 2 \in [0, 1]`;
    - **easy** group (:math:`d \le 1 - \tau`, i.e. :math:`p \ge \tau` with the default
      ``difficulty_threshold`` :math:`\tau = 0.6`): positive advantages are multiplied by
      :math:`H` — little more credit for what the model already does;
    - **hard** group (:math:`d \ge \tau`): negative advantages are multiplied by :math:`H` —
      smaller penalties where failure is the norm;
    - the rare outcome of each group (the failure in an easy group, the success in a hard one)
      and every group in between keep their GRPO advantage.

    With ``use_gepo`` off the advantages are exactly GRPO's.
"""

from __future__ import annotations

import math

import torch

from moescope.errors import MoescopeError

EPS = 1e-6


def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """``(groups, G)`` rewards → ``(groups, G)`` group-normalised advantages."""
    _check(rewards)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + EPS)


def group_entropy(p: torch.Tensor) -> torch.Tensor:
    """Binary entropy of success rate ``p``, in bits (0 for all-right or all-wrong groups)."""
    p = p.clamp(0.0, 1.0)
    h = -(torch.xlogy(p, p) + torch.xlogy(1 - p, 1 - p))
    return h / math.log(2)


def gepo_scale(rewards: torch.Tensor, advantages: torch.Tensor, threshold: float) -> torch.Tensor:
    """The per-sample factor GEPO applies to GRPO's advantages (1 where it changes nothing)."""
    p = rewards.mean(dim=1, keepdim=True).clamp(0.0, 1.0)
    h = group_entropy(p).expand_as(advantages)
    difficulty = (1 - p).expand_as(advantages)
    easy = (difficulty <= 1 - threshold) & (advantages > 0)
    hard = (difficulty >= threshold) & (advantages < 0)
    scale = torch.ones_like(advantages)
    return torch.where(easy | hard, h, scale)


def advantages(rewards: torch.Tensor, *, gepo: bool = False, threshold: float = 0.6) -> torch.Tensor:
    """GRPO advantages, with GEPO's correction when ``gepo``."""
    adv = grpo_advantages(rewards)
    return adv * gepo_scale(rewards, adv, threshold) if gepo else adv


def _check(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise MoescopeError(
            f"Group advantages need rewards shaped (groups, G) with G >= 2, got {tuple(rewards.shape)}; "
            "use group_size >= 2."
        )
