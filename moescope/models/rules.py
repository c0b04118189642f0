"""Routing rules built from a config: one builder per way an architecture routes.

Each builder reads the config fields its router reads (top-k, renormalization, scale, groups,
soft-cap) and returns the :class:`~moescope.models.routers.RoutingRule` that
:func:`~moescope.models.routers.route` applies. The architecture table
(:mod:`moescope.models.table`) names one builder per row; a builder that takes arguments
(:func:`softmax_topk`, :func:`sigmoid_bias`) returns the builder for one family member.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from moescope.errors import UnsupportedArchitectureError
from moescope.models.routers import RoutingRule

# Config switches the builders read that decide whether the chosen weights are renormalized,
# with the values a checkpoint may set: the settings a rule's weight semantics can hang on.
NORMALIZE_SWITCHES: dict[str, tuple[Any, ...]] = {
    "norm_topk_prob": (True, False),
    "ffn_config.moe_normalize_expert_weights": (1.0, None),
}


def softmax_topk(normalize: bool | str) -> Callable[[Any], RoutingRule]:
    """Softmax → top-k; ``normalize`` is a constant or the config key that decides it."""

    def rule(c: Any) -> RoutingRule:
        norm = getattr(c, normalize, False) if isinstance(normalize, str) else normalize
        return RoutingRule(top_k=c.num_experts_per_tok, normalize=bool(norm))

    return rule


def sigmoid_grouped(c: Any) -> RoutingRule:
    """DeepSeek-V3 family: sigmoid, correction bias for selection, group-limited top-k."""
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scoring="sigmoid",
        normalize=bool(c.norm_topk_prob),
        norm_eps=1e-20,
        scale=float(c.routed_scaling_factor),
        n_group=int(c.n_group or 1),
        topk_group=int(c.topk_group or 1),
        bias_for_selection=True,
    )


def sigmoid_grouped_unscaled(c: Any) -> RoutingRule:
    """Beam: the DeepSeek-V3 rule, but the router's weights are not scaled; its block scales
    the routed output by ``routed_scaling_factor`` after the experts (the same product)."""
    return replace(sigmoid_grouped(c), scale=1.0)


def sigmoid_topk(c: Any) -> RoutingRule:
    """Flint: sigmoid → top-k, no bias, renormalized if ``norm_topk_prob``."""
    return RoutingRule(top_k=c.num_experts_per_tok, scoring="sigmoid", normalize=bool(c.norm_topk_prob))


def laguna(c: Any) -> RoutingRule:
    """Laguna: logits soft-capped, sigmoid, correction bias for selection, always renormalized;
    the block scales the routed output by ``moe_routed_scaling_factor`` after the experts."""
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scoring="sigmoid",
        normalize=True,
        bias_for_selection=True,
        softcap=float(c.moe_router_logit_softcapping or 0.0),
    )


def kolibri(c: Any) -> RoutingRule:
    """Kolibri-1: top-k of the logits plus a correction bias → sigmoid of each chosen logit,
    renormalized if ``norm_topk_prob``."""
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scoring="logits",
        weights="sigmoid_selected",
        normalize=bool(c.norm_topk_prob),
        bias_for_selection=True,
    )


def inkling2(c: Any) -> RoutingRule:
    """Inkling 2: sigmoid, correction bias for selection, renormalized (+ 1e-20), × ``route_scale``."""
    if c.scoring_func != "sigmoid":
        raise UnsupportedArchitectureError(
            f"{c.model_type} with scoring_func={c.scoring_func!r} is not supported; moescope reads its "
            "routing with scoring_func='sigmoid', the published setting."
        )
    return sigmoid_bias(1e-20, "route_scale")(c)


def deepseek_v2(c: Any) -> RoutingRule:
    """DeepSeek-V2: softmax → top-k, group-limited (groups scored by their best expert) under
    ``topk_method="group_limited_greedy"``, × ``routed_scaling_factor``, not renormalized."""
    grouped = c.topk_method == "group_limited_greedy"
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scale=float(c.routed_scaling_factor),
        n_group=int(c.n_group or 1) if grouped else 1,
        topk_group=int(c.topk_group or 1) if grouped else 1,
        group_score="max",
        mask_fill=0.0,
    )


def logits_softmax(c: Any) -> RoutingRule:
    """GPT-OSS, Granite: top-k of the raw logits → softmax over the chosen logits."""
    return RoutingRule(top_k=c.num_experts_per_tok, scoring="logits", weights="softmax_selected")


def logits_sigmoid(c: Any) -> RoutingRule:
    """Llama 4: top-k of the raw logits → sigmoid of each chosen logit."""
    return RoutingRule(top_k=c.num_experts_per_tok, scoring="logits", weights="sigmoid_selected")


def sigmoid_bias(eps: float = 0.0, scale_key: str | None = None) -> Callable[[Any], RoutingRule]:
    """Sigmoid, bias for selection, always renormalized (+ ``eps``), × the config's ``scale_key``
    when given: MiniMax-M2 (no ε, no scale), AFMoE (``route_scale``), HY-V3
    (``router_scaling_factor``)."""

    def rule(c: Any) -> RoutingRule:
        return RoutingRule(
            top_k=c.num_experts_per_tok,
            scoring="sigmoid",
            normalize=True,
            norm_eps=eps,
            scale=float(getattr(c, scale_key)) if scale_key else 1.0,
            bias_for_selection=True,
        )

    return rule


def aria(c: Any) -> RoutingRule:
    """Aria: top-k of the raw logits → softmax over them, top-k under ``moe_topk``."""
    return RoutingRule(top_k=c.moe_topk, scoring="logits", weights="softmax_selected")


def cohere2(c: Any) -> RoutingRule:
    """Cohere2-MoE: top-k of the logits, then softmax over them, or sigmoid of each (renormalized
    if ``norm_topk_prob``), as ``expert_selection_fn`` says."""
    if c.expert_selection_fn == "sigmoid":
        return RoutingRule(
            top_k=c.num_experts_per_tok,
            scoring="logits",
            weights="sigmoid_selected",
            normalize=bool(c.norm_topk_prob),
        )
    return logits_softmax(c)


def lfm2(c: Any) -> RoutingRule:
    """LFM2-MoE: sigmoid (+ an expert bias for selection when ``use_expert_bias``) → top-k,
    renormalized if ``norm_topk_prob`` (+ 1e-6), × ``routed_scaling_factor``."""
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scoring="sigmoid",
        normalize=bool(c.norm_topk_prob),
        norm_eps=1e-6,
        scale=float(c.routed_scaling_factor),
        bias_for_selection=bool(c.use_expert_bias),
    )


def ernie(c: Any) -> RoutingRule:
    """ERNIE-4.5-MoE: softmax + correction bias → top-k, renormalized, the
    denominator clamped to at least ``moe_norm_min``."""
    return RoutingRule(top_k=c.moe_k, normalize=True, norm_min=float(c.moe_norm_min), bias_for_selection=True)


def phimoe(c: Any) -> RoutingRule:
    """PhiMoE: sparsemixer top-2, its threshold ``router_jitter_noise``."""
    return RoutingRule(top_k=2, scoring="sparsemixer", jitter_eps=float(c.router_jitter_noise))


def hunyuan(c: Any) -> RoutingRule:
    """HunYuan-MoE-V1: softmax → top-k under ``moe_topk``, renormalized."""
    return RoutingRule(top_k=c.moe_topk, normalize=True)


def dbrx(c: Any) -> RoutingRule:
    """DBRX: softmax → top-k → divided by their p-norm (``moe_normalize_expert_weights``, 1 by
    default: the sum; ``None``: not renormalized)."""
    ffn = c.ffn_config
    p = ffn.moe_normalize_expert_weights
    return RoutingRule(top_k=ffn.moe_top_k, normalize=p is not None, norm_p=float(p or 1))
