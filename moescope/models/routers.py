"""Router math of every supported architecture, as one parameterized function.

transformers gives each architecture its own router class. moescope needs the same math
outside those classes: to recompute routing on the kept experts of a proxy, to explain the
proxy's renormalization, and to check an adapter against the model. A :class:`RoutingRule`
names the choices an architecture makes; :func:`route` applies them.

The families (``scoring`` → ``select_on`` → ``weights``):

- softmax routers (e.g. Mixtral): ``softmax`` → top-k of the probabilities → the chosen
  probabilities, renormalized if ``normalize`` (by a p-norm with ``norm_p``, as DBRX does);
- DeepSeek-V3 / GLM-4-MoE / dots1: ``sigmoid`` → top-k of ``sigmoid + correction bias``
  inside the ``topk_group`` best of ``n_group`` groups → the chosen sigmoid scores (no bias),
  renormalized if ``normalize``, times ``scale``;
- Flint: ``sigmoid`` → top-k → the chosen scores, renormalized if ``normalize``; Laguna the
  same with a correction bias for selection, on logits soft-capped first (``softcap``);
- GPT-OSS / Granite: top-k of the raw logits → softmax over the k chosen logits;
- Llama 4: top-k of the raw logits → sigmoid of each chosen logit; Kolibri-1 chooses on the
  logits plus a correction bias, and renormalizes the chosen sigmoids if ``normalize``;
- PhiMoE: ``sparsemixer`` (top-2, masked softmax per pick); deterministic in eval mode only.

Examples
--------
>>> import torch
>>> rule = RoutingRule(top_k=2, scoring="softmax", normalize=True)
>>> weights, index = route(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), rule)
>>> index.tolist(), round(float(weights.sum()), 6)
([[0, 1]], 1.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Scoring = Literal["softmax", "sigmoid", "logits", "sparsemixer"]


@dataclass(frozen=True)
class RoutingRule:
    """How one architecture turns router logits ``[T, E]`` into top-k weights and indices.

    Attributes
    ----------
    top_k : experts chosen per token.
    scoring : ``softmax`` / ``sigmoid`` turn logits into scores before selection; ``logits``
        selects on raw logits; ``sparsemixer`` is PhiMoE's rule.
    weights : ``scores`` gathers the chosen scores; ``softmax_selected`` / ``sigmoid_selected``
        apply the function to the chosen logits only.
    normalize : divide the chosen weights by their sum (``norm_topk_prob``).
    norm_p : divide by their ``p``-norm instead when not 1 (DBRX's ``moe_normalize_expert_weights``).
    norm_eps : added to the denominator (DeepSeek 1e-20, LFM2 1e-6).
    norm_min : clamp of the denominator instead of an epsilon (Ernie's ``moe_norm_min``).
    scale : multiplies the final weights (``routed_scaling_factor``).
    n_group, topk_group : group-limited selection: experts split into ``n_group`` contiguous
        groups, only the ``topk_group`` best groups are eligible.
    group_score : ``top2_sum`` (DeepSeek-V3) or ``max`` (DeepSeek-V2) of the scores in a group.
    bias_for_selection : a correction bias is added to the scores (or, with ``scoring="logits"``,
        to the logits) for *selection only*.
    mask_fill : value given to experts outside the chosen groups (``-inf``, or ``0`` for V2).
    jitter_eps : PhiMoE's sparsemixer threshold (``router_jitter_noise``).
    softcap : the router bounds its logits smoothly to ``±softcap`` (``c·tanh(l / c)``) before
        anything else (Laguna's ``moe_router_logit_softcapping``; 0: not capped). The logits
        the router reports are the capped ones, so :func:`cap_logits` is applied where logits
        are computed, and :func:`route` takes them capped.
    """

    top_k: int
    scoring: Scoring = "softmax"
    weights: Literal["scores", "softmax_selected", "sigmoid_selected"] = "scores"
    normalize: bool = False
    norm_p: float = 1.0
    norm_eps: float = 0.0
    norm_min: float | None = None
    scale: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    group_score: Literal["top2_sum", "max"] = "top2_sum"
    bias_for_selection: bool = False
    mask_fill: float = float("-inf")
    jitter_eps: float = 0.0
    softcap: float = 0.0

    @property
    def grouped(self) -> bool:
        """True when selection is limited to the best groups of experts."""
        return self.n_group > 1 and self.topk_group < self.n_group


def cap_logits(logits: torch.Tensor, rule: RoutingRule) -> torch.Tensor:
    """``logits`` soft-capped as the rule's router caps them (unchanged when it does not)."""
    if rule.softcap <= 0:
        return logits
    return torch.tanh(logits.float() / rule.softcap) * rule.softcap  # in float32, as Laguna caps them


def route(
    logits: torch.Tensor, rule: RoutingRule, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply ``rule`` to router logits.

    Parameters
    ----------
    logits : ``(tokens, experts)`` router logits as the router reports them (a router bias, if
        any, added; soft-capped, if the rule caps them: :func:`cap_logits`).
    rule : the architecture's routing rule.
    bias : ``(experts,)`` selection-only correction bias, when ``rule.bias_for_selection``.

    Returns
    -------
    weights : ``(tokens, top_k)`` float32 routing weights.
    index : ``(tokens, top_k)`` int64 expert ids.
    """
    logits = logits.float()
    if rule.scoring == "sparsemixer":
        return _sparsemixer(logits, rule)
    for_choice = selection_scores(logits, rule, bias)
    index = torch.topk(for_choice, rule.top_k, dim=-1).indices
    masked = rule.scoring != "logits" and rule.grouped and rule.mask_fill == 0.0
    # DeepSeek-V2 selects *and weighs* on the masked scores
    return chosen_weights(logits, rule, index, for_choice if masked else None), index


def chosen_weights(
    logits: torch.Tensor, rule: RoutingRule, index: torch.Tensor, scores: torch.Tensor | None = None
) -> torch.Tensor:
    """``(tokens, top_k)`` routing weights of the experts ``index`` names, from ``logits``: the
    rule's scores of those experts (``scores`` when given), or its function of their logits,
    renormalized and scaled as the rule says. Routing replay weighs another pass's choice so."""
    logits = logits.float()
    if rule.scoring == "logits":
        chosen = logits.gather(1, index)
        weights = torch.softmax(chosen, -1) if rule.weights == "softmax_selected" else torch.sigmoid(chosen)
        return _finish(weights, rule)
    if scores is None:
        scores = torch.softmax(logits, -1) if rule.scoring == "softmax" else torch.sigmoid(logits)
    return _finish(scores.gather(1, index), rule)


def selection_scores(
    logits: torch.Tensor, rule: RoutingRule, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``(tokens, experts)`` scores the top-k is taken over: the rule's scores (or logits) plus
    the selection bias, experts outside the best groups set to ``rule.mask_fill``. PhiMoE's
    sparsemixer picks on the logits."""
    logits = logits.float()
    if rule.scoring == "sparsemixer":
        return logits
    biased = rule.bias_for_selection and bias is not None
    if rule.scoring == "logits":
        return logits + bias.float().reshape(-1) if biased else logits
    scores = torch.softmax(logits, -1) if rule.scoring == "softmax" else torch.sigmoid(logits)
    for_choice = scores + bias.float().reshape(-1) if biased else scores
    if rule.grouped:
        for_choice = for_choice.masked_fill(~_group_mask(for_choice, rule), rule.mask_fill)
    return for_choice


def topk_margin(for_choice: torch.Tensor, top_k: int) -> torch.Tensor:
    """``(tokens,)`` gap between the k-th and the (k+1)-th selection score: how far a token is
    from swapping its last chosen expert (NaN where fewer than k+1 experts are eligible)."""
    if for_choice.shape[-1] <= top_k:
        return torch.full(for_choice.shape[:-1], float("nan"))
    values = torch.topk(for_choice.float(), top_k + 1, dim=-1).values
    gap = values[..., top_k - 1] - values[..., top_k]
    return torch.where(torch.isfinite(gap), gap, torch.full_like(gap, float("nan")))


def _group_mask(scores: torch.Tensor, rule: RoutingRule) -> torch.Tensor:
    """``(tokens, experts)`` boolean mask of the experts in each token's best groups."""
    tokens, experts = scores.shape
    grouped = scores.view(tokens, rule.n_group, experts // rule.n_group)
    if rule.group_score == "top2_sum":
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
    else:
        group_scores = grouped.max(dim=-1).values
    best = torch.topk(group_scores, rule.topk_group, dim=-1).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return mask.unsqueeze(-1).expand_as(grouped).reshape(tokens, experts)


def _finish(weights: torch.Tensor, rule: RoutingRule) -> torch.Tensor:
    if rule.normalize:
        total = (
            weights.sum(-1, keepdim=True) if rule.norm_p == 1 else weights.norm(rule.norm_p, -1, keepdim=True)
        )
        total = total.clamp(min=rule.norm_min) if rule.norm_min is not None else total + rule.norm_eps
        weights = weights / total
    return weights * rule.scale


def _sparsemixer(logits: torch.Tensor, rule: RoutingRule) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's eval-mode sparsemixer: pick the best, then the best of the rest, each weighted
    by a softmax over the experts within ``2 * jitter_eps`` (relative) of the pick."""
    picks, weights, remaining = [], [], logits
    for _ in range(rule.top_k):
        best, index = remaining.max(dim=-1, keepdim=True)
        factor = logits.abs().clamp(min=best)
        outside = ((best - logits) / factor) > (2 * rule.jitter_eps)
        gates = torch.softmax(remaining.masked_fill(outside, float("-inf")), dim=-1)
        picks.append(index)
        weights.append(gates.gather(-1, index))
        remaining = remaining.scatter(-1, index, float("-inf"))
    return torch.cat(weights, -1), torch.cat(picks, -1)


def describe(rule: RoutingRule) -> str:
    """One line a person can read, e.g. ``sigmoid + bias → top-8 of best 4/8 groups, renormalized × 2.5``."""
    if rule.scoring == "sparsemixer":
        return f"sparsemixer top-{rule.top_k} (masked softmax per pick)"
    capped = f"logits capped at ±{rule.softcap:g} → " if rule.softcap > 0 else ""
    bias = " + correction bias" if rule.bias_for_selection else ""
    if rule.scoring == "logits":
        then = "softmax over the chosen" if rule.weights == "softmax_selected" else "sigmoid of each chosen"
        text = f"{capped}top-{rule.top_k} of logits{bias} → {then}"
    else:
        text = f"{capped}{rule.scoring}{bias} → top-{rule.top_k}"
    if rule.grouped:
        text += f" of the best {rule.topk_group}/{rule.n_group} groups"
    if rule.normalize:
        text += ", renormalized" + (f" by the {rule.norm_p:g}-norm" if rule.norm_p != 1 else "")
    if rule.scale != 1.0:
        text += f" × {rule.scale:g}"
    return text
