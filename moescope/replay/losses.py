r"""The actor objective: PPO-clip surrogate, k3 KL to the reference, router auxiliary losses.

All token losses are token means over response tokens, normalised by the *global* response
token count of the minibatch (summed over data-parallel ranks), so one process and two
processes with the same global batch give the same gradient.

- surrogate: :math:`\max(-A\,\rho, -A\,\mathrm{clip}(\rho, 1-\epsilon_{low}, 1+\epsilon_{high}))`
  with :math:`\rho = \exp(\log\pi - \log\pi_{old})` per token, or (GSPO) per response with
  the mean log-ratio over its tokens, the response's surrogate counted on each of its tokens;
- KL: the k3 estimator :math:`e^{\log\pi_{ref}-\log\pi} - (\log\pi_{ref}-\log\pi) - 1`, times β;
- load balancing: the Switch loss :math:`E \sum_e f_e P_e` per MoE layer, averaged over layers;
- z-loss: the mean squared log-sum-exp of router logits.
"""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum()


def ppo_clip(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token surrogate loss and a 0/1 tensor marking tokens where the clip was active."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def gspo_clip(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's surrogate (arXiv 2507.18071) per token: each response's length-normalised ratio
    ``exp(mean_t(log π − log π_old))`` clipped to ``[1 − clip_low, 1 + clip_high]``, its
    surrogate given to every token of the response, and a 0/1 tensor of the clipped ones."""
    log_ratio = ((logp - old_logp) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    ratio = log_ratio.clamp(max=20).exp().expand_as(logp)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def is_weights(
    train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, mode: str, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance-sampling correction of the rollout-vs-training mismatch, per token, and a 0/1
    tensor of the tokens it cut. ``token``: the ratio π_train / π_rollout truncated at
    ``threshold`` (TIS); ``sequence``: tokens of responses whose length-normalised ratio (the
    geometric mean over the response) lies outside ``[1/threshold, threshold]`` get weight 0,
    the rest 1 (masked importance sampling, verl's default threshold 2.0)."""
    log_ratio = (train_logp - rollout_logp).clamp(-20, 20)
    if mode == "token":
        ratio = log_ratio.exp()
        return ratio.clamp(max=threshold), (ratio > threshold).float() * mask
    per_seq = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    keep = (per_seq.abs() <= torch.log(torch.tensor(threshold))).float()[:, None].expand_as(mask)
    return keep, (1 - keep) * mask


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref): non-negative, unbiased, low variance."""
    delta = (ref_logp - logp).clamp(-20, 20)
    return torch.exp(delta) - delta - 1


def load_balancing(probs: list[torch.Tensor], index: list[torch.Tensor], num_experts: int) -> torch.Tensor:
    """Switch load-balancing loss, per layer then averaged; ``probs`` ``(T, E)``, ``index`` ``(T, k)``."""
    losses = []
    for p, idx in zip(probs, index, strict=True):
        counts = torch.zeros(num_experts, device=p.device).scatter_add_(
            0, idx.reshape(-1), torch.ones(idx.numel(), device=p.device)
        )
        f = counts / idx.numel()
        losses.append(num_experts * (f * p.float().mean(0)).sum())
    return torch.stack(losses).mean()


def z_loss(logits: list[torch.Tensor]) -> torch.Tensor:
    """Router z-loss: mean over layers of the mean squared log-sum-exp of the logits."""
    return torch.stack([torch.logsumexp(lg.float(), dim=-1).pow(2).mean() for lg in logits]).mean()
