"""Planted cluster structure: make a model's experts noisy copies of a few prototypes.

A test (or a sanity check on a real checkpoint) knows then which experts belong together and
can score a clustering against it, on any supported architecture: every tensor with one slice
per routed expert (fused expert weights and biases, router rows and biases, correction biases;
:meth:`moescope.models.view.MoELayer.named_expert_tensors`) is rewritten, so every view sees the
structure.

Examples
--------
>>> from moescope.models.zoo import tiny
>>> model = tiny("mixtral")
>>> labels = plant_prototypes(model, n_prototypes=4, noise=0.1, seed=0)
>>> labels.shape, sorted(set(labels[0].tolist()))
((2, 8), [0, 1, 2, 3])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from moescope.errors import MoescopeError
from moescope.models.view import MoELayer, MoEModel, adapt, experts_first

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def plant_prototypes(
    model: PreTrainedModel | MoEModel,
    n_prototypes: int,
    noise: float = 0.1,
    seed: int = 0,
    *,
    groups: int = 1,
) -> np.ndarray:
    """Rewrite every MoE layer in place so each expert is a noisy copy of one of ``n_prototypes``.

    Per layer, the prototypes are ``n_prototypes`` of the layer's own experts (so scales stay
    realistic) and experts are assigned to them in equal shares, in a seeded random order;
    each copy gets Gaussian noise of ``noise`` × the tensor's standard deviation. With
    ``groups > 1`` the experts form that many contiguous groups (grouped routing) and each
    group has ``n_prototypes / groups`` prototypes of its own.

    Returns
    -------
    ``(L, E)`` int array: the planted prototype of every expert in every MoE layer.
    """
    moe = model if isinstance(model, MoEModel) else adapt(model)
    n_experts = moe.num_experts
    if n_prototypes % groups or n_experts % groups or not groups <= n_prototypes <= n_experts:
        raise MoescopeError(
            f"cannot plant {n_prototypes} prototypes among {n_experts} experts in {groups} groups; "
            "use a prototype count that both the groups divide and the experts can hold."
        )
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    planted = []
    for layer in moe.layers:
        labels, sources = _assignment(rng, n_experts, n_prototypes, groups)
        _rewrite(layer, labels, sources, noise, generator)
        planted.append(labels)
    return np.stack(planted)


def _assignment(
    rng: np.random.Generator, n_experts: int, k: int, groups: int
) -> tuple[np.ndarray, np.ndarray]:
    """Labels ``(E,)`` (equal shares, shuffled inside each group) and one source expert per label."""
    size, per = n_experts // groups, k // groups
    labels = np.concatenate([g * per + rng.permutation(np.arange(size) % per) for g in range(groups)])
    sources = np.array([rng.choice(np.flatnonzero(labels == c)) for c in range(k)])
    return labels, sources


def _rewrite(
    layer: MoELayer, labels: np.ndarray, sources: np.ndarray, noise: float, generator: torch.Generator
) -> None:
    n_experts = len(labels)
    for _, tensor in layer.named_expert_tensors():
        with torch.no_grad():
            view = experts_first(tensor.data, n_experts)
            copies = view[torch.as_tensor(sources[labels])].float()
            jitter = torch.randn(copies.shape, generator=generator) * (noise * view.float().std())
            view.copy_((copies + jitter.to(copies.device)).to(view.dtype))
