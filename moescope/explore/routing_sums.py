"""Running routing sums and per-slot expert-output norms: the tensor math behind the observer.

:class:`RoutingSums` holds float64 / int64 totals on the model's device and folds in one
forward pass of all MoE layers at once (``(l, T, E)`` stacks), so the per-batch cost is a
handful of batched operations whatever the layer count, plus the routed-context sums (one
``(E, H)`` scatter-add per layer, :func:`routed_context`). :func:`slot_norms` reorders the norms
captured inside transformers' fused experts; :func:`recomputed_norms` is the fallback that runs
each routed expert on its own routed tokens only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from moescope.models.view import MoELayer

ENTROPY_BINS = 32
"""Histogram bins of per-token routing entropy, evenly spaced on ``[0, ln E]``."""

CONTEXT_ROWS = 4096
"""Tokens whose hidden states :func:`routed_context` casts to float32 at a time."""

SLOT_ORDER = {"batched_mm": "token-major", "grouped_mm": "sorted-by-expert"}
"""How each fused experts implementation orders the per-slot outputs it hands to
``post_expert_norm``: ``(T * k,)`` token-major, or sorted by expert id."""


def max_entropy(num_experts: int) -> float:
    """Entropy of the uniform distribution over ``num_experts`` (the histogram's upper edge)."""
    return max(math.log(num_experts), 1e-12)


def distribution(logits: torch.Tensor, sigmoid: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token distribution over experts of ``(..., E)`` logits (see ``RoutingStats.prob_mass``)
    and its entropy in nats ``(...)``, from the log-scores already at hand (no extra log pass)."""
    if sigmoid:
        log_scores = torch.nn.functional.logsigmoid(logits)
        scores = log_scores.exp()
        total = scores.sum(-1, keepdim=True)
        probs = scores / total
        entropy = total.log() - (probs * log_scores).sum(-1, keepdim=True)
    else:
        shifted = logits - logits.amax(-1, keepdim=True)  # log p = shifted - log Σ exp(shifted)
        probs = torch.softmax(shifted, -1)
        log_norm = -probs.amax(-1, keepdim=True).log()  # the top expert has shifted logit 0
        entropy = log_norm - (probs * shifted).sum(-1, keepdim=True)
    return probs, entropy.squeeze(-1).clamp_(min=0.0)


def _bincount(values: torch.Tensor, size: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``(l, size)`` counts (or weight sums) of ``(l, ...)`` values in ``[0, size)``, one row per layer."""
    offsets = torch.arange(values.shape[0], device=values.device) * size
    flat = (values + offsets.view(-1, *[1] * (values.dim() - 1))).flatten()
    w = None if weights is None else weights.flatten().double()
    return torch.bincount(flat, weights=w, minlength=values.shape[0] * size).view(-1, size)


class RoutingSums:
    """Totals of ``n_layers`` MoE layers; ``add`` folds in one forward pass."""

    def __init__(
        self, n_layers: int, n_experts: int, device: torch.device, sigmoid: bool, hidden: int = 0
    ) -> None:
        if device.type == "mps":  # no float64 there
            device = torch.device("cpu")
        f64, i64 = dict(dtype=torch.float64, device=device), dict(dtype=torch.int64, device=device)
        self.n_experts, self.sigmoid = n_experts, sigmoid
        self.context = torch.zeros(n_layers, n_experts, hidden, **f64) if hidden else None
        self.gate = torch.zeros(n_layers, n_experts, **f64)
        self.tokens = torch.zeros(n_layers, **i64)
        self.prob = torch.zeros(n_layers, n_experts, **f64)
        self.saliency = torch.zeros(n_layers, n_experts, **f64)
        self.coact = torch.zeros(n_layers, n_experts, n_experts, **i64)
        self.entropy = torch.zeros(n_layers, 2, **f64)  # sum, sum of squares
        self.hist = torch.zeros(n_layers, ENTROPY_BINS, **i64)
        self.max = torch.full((n_layers, n_experts), -math.inf, **f64)

    @torch.no_grad()
    def add(
        self,
        rows: list[int],
        logits: torch.Tensor,
        index: torch.Tensor,
        saliency: torch.Tensor,
        valid: torch.Tensor | None,
    ) -> None:
        """Add one pass of the layers in ``rows``.

        Parameters
        ----------
        rows : row of each stacked layer in the totals.
        logits : ``(l, T, E)`` raw router logits.
        index, saliency : ``(l, T, k)`` chosen experts, and gate weight × ‖expert output‖ per slot.
        valid : ``(T,)`` bool, False for padding; ``None`` counts every token.
        """
        device, n_experts = self.tokens.device, self.n_experts
        logits, index, saliency = logits.to(device, torch.float32), index.to(device), saliency.to(device)
        if valid is not None:
            if valid.numel() != logits.shape[1]:
                raise RuntimeError("the attention mask does not match the tokens the routers saw")
            keep = valid.to(device).nonzero().squeeze(1)
            logits, index, saliency = (t.index_select(1, keep) for t in (logits, index, saliency))
        r = slice(None) if rows == list(range(len(self.tokens))) else torch.tensor(rows, device=device)
        probs, entropy = distribution(logits, self.sigmoid)  # (l, T, E), (l, T)
        pairs = index.unsqueeze(-1) * n_experts + index.unsqueeze(-2)  # (l, T, k, k): i==j gives counts
        self.tokens[r] += logits.shape[1]
        self.prob[r] += probs.sum(1, dtype=torch.float64)
        self.coact[r] += _bincount(pairs, n_experts * n_experts).view(-1, n_experts, n_experts)
        self.saliency[r] += _bincount(index, n_experts, weights=saliency)
        self.max[r] = torch.maximum(self.max[r], logits.amax(1).double())
        squares = entropy.square().sum(1, dtype=torch.float64)
        self.entropy[r] += torch.stack([entropy.sum(1, dtype=torch.float64), squares], -1)
        bins = (entropy * (ENTROPY_BINS / max_entropy(n_experts))).long().clamp_(0, ENTROPY_BINS - 1)
        self.hist[r] += _bincount(bins, ENTROPY_BINS)

    @torch.no_grad()
    def add_context(self, row: int, context: torch.Tensor, gate: torch.Tensor) -> None:
        """Add one pass of layer row ``row``: ``(E, H)`` gate-weighted input sums and ``(E,)``
        gate-weight sums (:func:`routed_context`)."""
        if self.context is not None:
            self.context[row] += context.to(self.context.device, torch.float64)
            self.gate[row] += gate.to(self.gate.device, torch.float64)

    def arrays(self) -> dict[str, np.ndarray | None]:
        """The totals as ``RoutingStats`` fields (counts are the co-activation diagonal)."""
        coact = self.coact.cpu().numpy()
        expert_max = self.max.cpu().numpy()
        context = None if self.context is None else self.context.cpu().numpy()
        return {
            "counts": np.ascontiguousarray(np.diagonal(coact, axis1=1, axis2=2)),
            "prob_mass": self.prob.cpu().numpy(),
            "coactivation": coact,
            "saliency_sum": self.saliency.cpu().numpy(),
            "entropy_sum": self.entropy[:, 0].cpu().numpy(),
            "entropy_sq_sum": self.entropy[:, 1].cpu().numpy(),
            "entropy_hist": self.hist.cpu().numpy(),
            "entropy_edges": np.linspace(0.0, max_entropy(self.n_experts), ENTROPY_BINS + 1),
            "max_logit": expert_max.max(axis=1),
            "expert_max_logit": expert_max,
            "context_sum": context,
            "context_weight": None if context is None else self.gate.cpu().numpy(),
        }


@torch.no_grad()
def routed_context(
    hidden: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    valid: torch.Tensor | None,
    n_experts: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's routed context of one pass: ``(E, H)`` sums of ``weight × hidden state`` over
    the slots routed to each expert, and ``(E,)`` sums of those weights, in float32.

    ``hidden`` ``(T, H)`` is the MoE block's input, ``index`` / ``weights`` ``(T, k)`` the chosen
    experts and the gate weights the model applies; padding (``valid`` False) counts nothing.
    The sums are a product of the ``(T, E)`` gate weights with the hidden states, taken
    :data:`CONTEXT_ROWS` tokens at a time in float32: a float32 copy of every slot's hidden state
    (``T × k × H``) was the largest tensor of a layer-sequential calibration pass.
    """
    weights = weights.float()
    if valid is not None:
        weights = weights * valid.to(weights.device).unsqueeze(1)
    dense = torch.zeros(len(index), n_experts, device=hidden.device)  # (T, E) gate weights
    dense.scatter_add_(1, index.long(), weights)
    context = torch.zeros(n_experts, hidden.shape[1], device=hidden.device)
    for start in range(0, len(hidden), CONTEXT_ROWS):
        rows = slice(start, start + CONTEXT_ROWS)
        context.addmm_(dense[rows].T, hidden[rows].float())
    return context, dense.sum(0)


def slot_norms(impl: str, norms: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``(T, k)`` norms from the ``(T * k,)`` order experts implementation ``impl`` computed them in."""
    if SLOT_ORDER[impl] == "token-major":
        return norms.view(index.shape)
    perm = torch.sort(index.reshape(-1)).indices  # the very call grouped_mm sorts its slots with
    return torch.empty_like(norms).index_copy_(0, perm, norms).view(index.shape)


@torch.no_grad()
def recomputed_norms(
    layer: MoELayer, hidden: torch.Tensor, index: torch.Tensor, valid: torch.Tensor | None
) -> torch.Tensor:
    """``(T, k)`` ‖expert output‖ per routed slot of ``(T, H)`` states, each expert run on the
    tokens routed to it only; padding slots are skipped and left 0."""
    n_tokens, k = index.shape
    slots = torch.arange(n_tokens * k, device=index.device)
    if valid is not None:
        slots = slots[valid.to(index.device).repeat_interleave(k)]
    experts = index.reshape(-1)[slots]
    slots = slots[torch.argsort(experts, stable=True)]
    sizes = torch.bincount(experts, minlength=layer.num_experts).tolist()
    norms = torch.zeros(n_tokens * k, dtype=torch.float32, device=index.device)
    for expert, group in enumerate(slots.split(sizes)):
        if group.numel():
            out = layer.expert_forward(expert, hidden[group // k])
            norms[group] = torch.linalg.vector_norm(out, dim=-1, dtype=torch.float32)
    return norms.view(n_tokens, k)
