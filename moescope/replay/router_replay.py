"""Rollout Routing Replay: training reuses the experts the rollout engine chose for each token.

The fix MoE RL frameworks ship against routing mismatch (R3, arXiv 2510.11370; verl's
``router_replay.mode=R3``, Megatron-core's ``RouterReplay``, slime's
``--use-rollout-routing-replay``): the rollout's top-k *indices* are recorded and replayed in the
trainer's forward passes, while their weights are computed from the trainer's live router scores,
so gradients still reach the router. Here the record is the rollout engine's scoring pass over the
batch (its routing for the same tokens), and every MoE layer's router module is wrapped so that
it returns the recorded index with :func:`~moescope.models.routers.chosen_weights` of its own live
logits. Routers that return the ``(logits, weights, index)`` triple are supported; Llama 4's and
DBRX's, which return scores or logits alone, and PhiMoE's sampled sparsemixer are refused.

The replay checks its own wiring as frameworks now do (miles PR 25): given a
:class:`RouteOverlap`, each replayed choice is compared with the one the trainer's live router
makes for the same token, and the share they have in common is logged
(``rollout/route_overlap``; the ``route_overlap_low`` finding when it drops, as when routes are
replayed from a stale step or shifted by a token).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from moescope._util.forwards import patched_forwards
from moescope.errors import MoescopeError
from moescope.models.routers import chosen_weights
from moescope.models.view import MoELayer, MoEModel


def check_replayable(moe: MoEModel) -> None:
    """Refuse a model whose routers cannot take another pass's choice (one sentence): the first
    router is asked once, on one zero token, what it returns."""
    layer = moe.layers[0]
    weight = layer.router_weight
    with torch.no_grad():
        out = layer.router(torch.zeros(1, weight.shape[-1], dtype=weight.dtype, device=weight.device))
    triple = isinstance(out, tuple) and len(out) == 3
    if not triple or layer.spec.combine != "output" or layer.rule.scoring == "sparsemixer":
        raise MoescopeError(
            f"routing replay needs routers that return (logits, weights, index); {moe.spec.model_type}'s "
            "do not; run without routing_replay."
        )


@dataclass
class RouteOverlap:
    """Replayed choices that the live router also made (``agree``) out of all replayed (``slots``),
    over the real tokens (``valid``, flat; every token when ``None``)."""

    valid: torch.Tensor | None = None
    agree: float = 0.0
    slots: float = 0.0

    def add(self, chosen: torch.Tensor, live: torch.Tensor) -> None:
        """Count one MoE application's ``(T, k)`` replayed and live choices."""
        same = (chosen[:, :, None] == live[:, None, :]).any(-1).float()  # (T, k)
        if self.valid is not None:
            same = same[self.valid.to(same.device)]
        self.agree += float(same.sum())
        self.slots += float(same.numel())


@contextmanager
def replayed_routing(
    moe: MoEModel, indices: list[torch.Tensor], overlap: RouteOverlap | None = None
) -> Iterator[None]:
    """Every MoE layer application, in order, routes its tokens to ``indices[i]`` (``[T, k]``),
    weighted from its live logits, counted into ``overlap`` when given; the wrappers are removed
    on exit."""
    pending = list(indices)

    def replaying(layer: MoELayer) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            def replayed(*args, **kwargs):
                logits, weights, index = original(*args, **kwargs)
                if not pending:
                    raise MoescopeError("routing replay ran out of recorded choices; the passes differ.")
                chosen = pending.pop(0).to(index.device).reshape(index.shape)
                flat = logits.reshape(-1, logits.shape[-1])
                new = chosen_weights(flat, layer.rule, chosen.reshape(-1, chosen.shape[-1]))
                if overlap is not None:
                    with torch.no_grad():
                        k = chosen.shape[-1]
                        overlap.add(chosen.reshape(-1, k), index.reshape(-1, index.shape[-1]))
                return logits, new.reshape(weights.shape).to(weights.dtype), chosen

            return replayed

        return wrap

    with patched_forwards((layer.router, replaying(layer)) for layer in moe.layers):
        yield
