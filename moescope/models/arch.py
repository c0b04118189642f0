"""Architecture adapters: one declarative table over stock ``transformers`` MoE classes.

Every supported model type has one :class:`ArchSpec` row saying where a decoder layer keeps
its MoE block, router, experts, biases and shared experts, which config keys hold the expert
count and top-k, how its router scores (:mod:`moescope.models.routers`), and how its fused expert
tensors are laid out. :func:`adapt` reads a loaded model through its row and gives a uniform
view (:class:`MoEModel` → :class:`MoELayer` → :class:`ExpertWeights`), so routing statistics,
clustering, export and replay never special-case an architecture.

Facts behind the table (transformers 5.x): experts are fused 3-D parameters in memory —
``gate_up_proj [E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]`` for most models;
GPT-OSS stores them transposed with gate/up *interleaved* on the last axis plus per-expert
biases; Llama 4 stores them transposed and concatenated; DBRX keeps 2-D ``w1``, ``v1``, ``w2``
``[E·I, H]``, one block of ``I`` rows per expert, and its expert settings in ``ffn_config``.

Examples
--------
>>> from moescope.models.zoo import tiny
>>> moe = adapt(tiny("mixtral"))
>>> moe.num_experts, moe.top_k, [layer.index for layer in moe.layers]
(8, 2, [0, 1])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from moescope.errors import MoescopeError, UnsupportedArchitectureError
from moescope.models.routers import RoutingRule, cap_logits, route

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

Layout = Literal["fused", "fused_transposed", "fused_transposed_interleaved", "up_down", "stacked_rows"]

# Keys that hold a routed-expert count in some config: a model whose config has one of these
# but no row in the table is an MoE we do not support yet (rather than a dense model).
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True)
class ArchSpec:
    """Where one transformers MoE architecture keeps routing and experts.

    Paths are dotted attribute paths: ``block`` from a decoder layer; ``router``,
    ``experts``, ``shared_experts``, ``shared_gate`` and ``correction_bias`` from the block
    (a leading ``^`` means from the decoder layer instead); ``router_weight`` and
    ``router_bias`` from the router; ``expert_params`` from the experts module, where the
    expert tensors live when not on it (DBRX's ``experts.mlp``). Config keys may be dotted
    too, for settings kept in a sub-config (DBRX's ``ffn_config.moe_num_experts``).
    """

    model_type: str
    name: str
    count_key: str  # config.json field of the routed-expert count (what export rewrites)
    intermediate_key: str  # config field of one routed expert's FFN width
    rule: Callable[[PretrainedConfig], RoutingRule]
    topk_key: str = "num_experts_per_tok"
    block: str = "mlp"
    router: str = "gate"
    router_weight: str = "weight"
    router_bias: str | None = None
    router_fp32: bool = False  # the router upcasts weights and inputs to float32 (DeepSeek, Ernie)
    correction_bias: str | None = None
    experts: str = "experts"
    expert_params: str | None = None
    layout: Layout = "fused"
    activation: Literal["glu", "clamped_swiglu", "paired"] = "glu"  # paired: act_fn(gate, up)
    combine: Literal["output", "input"] = "output"  # Llama 4 scales the expert *input*
    shared_experts: str | None = None
    shared_gate: str | None = None
    shared_count_key: str | None = None  # config field: how many experts the shared module fuses
    shared_intermediate_key: str | None = None
    shared_combine: str | None = None  # block attribute: "sum" or "average" (Cohere2-MoE)
    latent_in: str | None = None  # block module projecting into the experts' latent space
    latent_out: str | None = None  # and back out (Nemotron-H; Identity without moe_latent_size)
    notes: str = ""

    def num_experts(self, config: PretrainedConfig) -> int:
        """Routed experts per MoE layer, read under this architecture's own key."""
        return int(config_value(config, self.count_key))

    def top_k(self, config: PretrainedConfig) -> int:
        """Routed experts chosen per token."""
        return int(config_value(config, self.topk_key))


def config_value(config: Any, key: str) -> Any:
    """The config field at a dotted ``key`` (``ffn_config.moe_top_k`` reads a sub-config), in a
    config or its ``to_dict()`` alike."""
    obj = config
    for part in key.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def set_config_value(config: Any, key: str, value: Any) -> None:
    """Set the config field at a dotted ``key``, in a sub-config or a dict alike."""
    parent, _, name = key.rpartition(".")
    owner = config_value(config, parent) if parent else config
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


# --- routing rules, built from a config --------------------------------------------------------


def _softmax(normalize: bool | str) -> Callable[[Any], RoutingRule]:
    """Softmax → top-k; ``normalize`` is a constant or the config key that decides it."""

    def rule(c: Any) -> RoutingRule:
        norm = getattr(c, normalize, False) if isinstance(normalize, str) else normalize
        return RoutingRule(top_k=c.num_experts_per_tok, normalize=bool(norm))

    return rule


def _sigmoid_grouped(c: Any) -> RoutingRule:
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


def _sigmoid_grouped_unscaled(c: Any) -> RoutingRule:
    """Beam: the DeepSeek-V3 rule, but the router's weights are not scaled; its block scales
    the routed output by ``routed_scaling_factor`` after the experts (the same product)."""
    return replace(_sigmoid_grouped(c), scale=1.0)


def _sigmoid_topk(c: Any) -> RoutingRule:
    """Flint: sigmoid → top-k, no bias, renormalized if ``norm_topk_prob``."""
    return RoutingRule(top_k=c.num_experts_per_tok, scoring="sigmoid", normalize=bool(c.norm_topk_prob))


def _laguna(c: Any) -> RoutingRule:
    """Laguna: logits soft-capped, sigmoid, correction bias for selection, always renormalized;
    the block scales the routed output by ``moe_routed_scaling_factor`` after the experts."""
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scoring="sigmoid",
        normalize=True,
        bias_for_selection=True,
        softcap=float(c.moe_router_logit_softcapping or 0.0),
    )


def _kolibri(c: Any) -> RoutingRule:
    """Kolibri-1: top-k of the logits plus a correction bias → sigmoid of each chosen logit,
    renormalized if ``norm_topk_prob``."""
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scoring="logits",
        weights="sigmoid_selected",
        normalize=bool(c.norm_topk_prob),
        bias_for_selection=True,
    )


def _inkling2(c: Any) -> RoutingRule:
    """Inkling 2: sigmoid, correction bias for selection, renormalized (+ 1e-20), × ``route_scale``."""
    if c.scoring_func != "sigmoid":
        raise UnsupportedArchitectureError(
            f"{c.model_type} with scoring_func={c.scoring_func!r} is not supported; moescope reads its "
            "routing with scoring_func='sigmoid', the published setting."
        )
    return _sigmoid_bias(1e-20, "route_scale")(c)


def _deepseek_v2(c: Any) -> RoutingRule:
    grouped = c.topk_method == "group_limited_greedy"
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scale=float(c.routed_scaling_factor),
        n_group=int(c.n_group or 1) if grouped else 1,
        topk_group=int(c.topk_group or 1) if grouped else 1,
        group_score="max",
        mask_fill=0.0,
    )


def _logits_softmax(c: Any) -> RoutingRule:
    return RoutingRule(top_k=c.num_experts_per_tok, scoring="logits", weights="softmax_selected")


def _logits_sigmoid(c: Any) -> RoutingRule:
    return RoutingRule(top_k=c.num_experts_per_tok, scoring="logits", weights="sigmoid_selected")


def _sigmoid_bias(eps: float = 0.0, scale_key: str | None = None) -> Callable[[Any], RoutingRule]:
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


def _aria(c: Any) -> RoutingRule:
    return RoutingRule(top_k=c.moe_topk, scoring="logits", weights="softmax_selected")


def _cohere2(c: Any) -> RoutingRule:
    """Cohere2-MoE: top-k of the logits, then softmax over them, or sigmoid of each (renormalized
    if ``norm_topk_prob``), as ``expert_selection_fn`` says."""
    if c.expert_selection_fn == "sigmoid":
        return RoutingRule(
            top_k=c.num_experts_per_tok,
            scoring="logits",
            weights="sigmoid_selected",
            normalize=bool(c.norm_topk_prob),
        )
    return _logits_softmax(c)


def _lfm2(c: Any) -> RoutingRule:
    return RoutingRule(
        top_k=c.num_experts_per_tok,
        scoring="sigmoid",
        normalize=bool(c.norm_topk_prob),
        norm_eps=1e-6,
        scale=float(c.routed_scaling_factor),
        bias_for_selection=bool(c.use_expert_bias),
    )


def _ernie(c: Any) -> RoutingRule:
    return RoutingRule(top_k=c.moe_k, normalize=True, norm_min=float(c.moe_norm_min), bias_for_selection=True)


def _phimoe(c: Any) -> RoutingRule:
    return RoutingRule(top_k=2, scoring="sparsemixer", jitter_eps=float(c.router_jitter_noise))


def _hunyuan(c: Any) -> RoutingRule:
    return RoutingRule(top_k=c.moe_topk, normalize=True)


def _dbrx(c: Any) -> RoutingRule:
    """DBRX: softmax → top-k → divided by their p-norm (``moe_normalize_expert_weights``, 1 by
    default: the sum; ``None``: not renormalized)."""
    ffn = c.ffn_config
    p = ffn.moe_normalize_expert_weights
    return RoutingRule(top_k=ffn.moe_top_k, normalize=p is not None, norm_p=float(p or 1))


# --- the table ---------------------------------------------------------------------------------

_DEEPSEEK_STYLE = dict(
    count_key="n_routed_experts",
    intermediate_key="moe_intermediate_size",
    rule=_sigmoid_grouped,
    router_fp32=True,
    correction_bias="gate.e_score_correction_bias",
    shared_experts="shared_experts",
    shared_count_key="n_shared_experts",
)
_DEEPSEEK_STYLE_NUM = {
    **_DEEPSEEK_STYLE,
    "count_key": "num_experts",
    "shared_count_key": "num_shared_experts",
}
_GRANITE = dict(
    count_key="num_local_experts",
    intermediate_key="intermediate_size",
    rule=_logits_softmax,
    block="block_sparse_moe",
    router="router",
)
_GRANITE_SHARED = dict(
    **_GRANITE, shared_experts="^shared_mlp", shared_intermediate_key="shared_intermediate_size"
)
_QWEN_SHARED = dict(
    shared_experts="shared_expert",
    shared_gate="shared_expert_gate",
    shared_intermediate_key="shared_expert_intermediate_size",
)

_INKLING2 = dict(
    router_fp32=True,
    correction_bias="gate.e_score_correction_bias",
    activation="paired",
)

_SPECS = [
    ArchSpec("mixtral", "Mixtral", "num_local_experts", "intermediate_size", _softmax(True)),
    ArchSpec("minimax", "MiniMax-Text", "num_local_experts", "intermediate_size", _softmax(True)),
    ArchSpec(
        "qwen2_moe",
        "Qwen2-MoE",
        "num_experts",
        "moe_intermediate_size",
        _softmax("norm_topk_prob"),
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "qwen3_moe", "Qwen3-MoE", "num_local_experts", "moe_intermediate_size", _softmax("norm_topk_prob")
    ),
    ArchSpec(
        "qwen3_next",
        "Qwen3-Next",
        "num_experts",
        "moe_intermediate_size",
        _softmax("norm_topk_prob"),
        notes="hybrid linear attention (Gated DeltaNet) layers",
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "qwen3_5_moe_text",
        "Qwen3.5-MoE (text)",
        "num_experts",
        "moe_intermediate_size",
        _softmax(True),
        notes="hybrid linear attention (Gated DeltaNet) layers",
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "qwen4_exp_text",
        "Qwen4-Exp (text)",
        "num_experts",
        "moe_intermediate_size",
        _softmax("norm_topk_prob"),
        notes="hybrid linear and indexed attention layers; hyper-connections, n-gram embeddings",
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "lara_mini",
        "Lara-Mini",
        "num_experts",
        "moe_intermediate_size",
        _softmax("norm_topk_prob"),
        router_fp32=True,
        shared_experts="shared_expert",
        shared_intermediate_key="shared_expert_intermediate_size",
    ),
    ArchSpec("mellum", "Mellum", "num_local_experts", "moe_intermediate_size", _softmax("norm_topk_prob")),
    ArchSpec(
        "aria_text",
        "Aria (text)",
        "moe_num_experts",
        "intermediate_size",
        _aria,
        topk_key="moe_topk",
        router="router",
        layout="fused_transposed",
        shared_experts="shared_experts",
        shared_count_key="moe_num_shared_experts",
    ),
    ArchSpec("olmoe", "OLMoE", "num_experts", "intermediate_size", _softmax("norm_topk_prob")),
    ArchSpec("flex_olmo", "FlexOlmo", "num_experts", "intermediate_size", _softmax("norm_topk_prob")),
    ArchSpec(
        "hunyuan_v1_moe",
        "HunYuan-MoE-V1",
        "num_experts",
        "intermediate_size",
        _hunyuan,
        topk_key="moe_topk",
        router_weight="wg.weight",
        shared_experts="shared_mlp",
    ),
    ArchSpec(
        "jamba",
        "Jamba",
        "num_experts",
        "intermediate_size",
        _softmax(False),
        block="feed_forward",
        router="router",
        notes="hybrid Mamba layers; MoE every expert_layer_period layers",
    ),
    ArchSpec(
        "phimoe",
        "PhiMoE",
        "num_local_experts",
        "intermediate_size",
        _phimoe,
        router="router",
        notes="sparsemixer top-2 is hard-wired; routes are sampled in train mode",
    ),
    ArchSpec("granitemoe", "GraniteMoE", **_GRANITE),
    ArchSpec("granitemoeshared", "GraniteMoE-Shared", **_GRANITE_SHARED),
    ArchSpec("granitemoehybrid", "GraniteMoE-Hybrid", **_GRANITE_SHARED, notes="hybrid Mamba-2 layers"),
    ArchSpec("granitemoe_swa", "GraniteMoE-SWA", **_GRANITE_SHARED, notes="sliding-window attention layers"),
    ArchSpec(
        "cohere2_moe",
        "Cohere2-MoE",
        "num_experts",
        "intermediate_size",
        _cohere2,
        shared_experts="shared_experts",
        shared_count_key="num_shared_experts",
        shared_combine="shared_expert_combination_strategy",
        notes="shared experts summed with, or averaged into, the routed output",
    ),
    ArchSpec(
        "afmoe",
        "AFMoE",
        "num_experts",
        "moe_intermediate_size",
        _sigmoid_bias(1e-20, "route_scale"),
        router="router",
        router_weight="gate.weight",
        correction_bias="expert_bias",
        shared_experts="shared_experts",
        shared_count_key="num_shared_experts",
    ),
    ArchSpec(
        "gpt_oss",
        "GPT-OSS",
        "num_local_experts",
        "intermediate_size",
        _logits_softmax,
        router="router",
        router_bias="bias",
        layout="fused_transposed_interleaved",
        activation="clamped_swiglu",
        notes="router bias; per-expert biases; gate/up interleaved, transposed",
    ),
    ArchSpec(
        "deepseek_v2",
        "DeepSeek-V2",
        "n_routed_experts",
        "moe_intermediate_size",
        _deepseek_v2,
        router_fp32=True,
        shared_experts="shared_experts",
        shared_count_key="n_shared_experts",
    ),
    ArchSpec("deepseek_v3", "DeepSeek-V3", **_DEEPSEEK_STYLE),
    ArchSpec("sarvam_mla", "Sarvam-MLA", **_DEEPSEEK_STYLE),
    ArchSpec("axk1", "A.X-K1", **_DEEPSEEK_STYLE, notes="a norm after the experts, inside the block"),
    ArchSpec("axk2", "A.X-K2", **_DEEPSEEK_STYLE),
    ArchSpec("hy_v4", "HY-V4", **_DEEPSEEK_STYLE),
    ArchSpec(
        "hy_v3",
        "HY-V3",
        "num_experts",
        "moe_intermediate_size",
        _sigmoid_bias(1e-20, "router_scaling_factor"),
        router_fp32=True,
        correction_bias="e_score_correction_bias",
        shared_experts="shared_experts",
        shared_count_key="num_shared_experts",
    ),
    ArchSpec(
        "nemotron_h",
        "Nemotron-H",
        **{**_DEEPSEEK_STYLE, "shared_count_key": None},
        block="mixer",
        layout="up_down",
        shared_intermediate_key="moe_shared_expert_intermediate_size",
        latent_in="fc1_latent_proj",
        latent_out="fc2_latent_proj",
        notes="hybrid Mamba-2 layers; experts down(relu²(up x)) with no gate, optionally in a latent space",
    ),
    ArchSpec(
        "deepseek_v32", "DeepSeek-V3.2", **_DEEPSEEK_STYLE, notes="sparse attention (lightning indexer)"
    ),
    ArchSpec("glm_moe_dsa", "GLM-MoE-DSA", **_DEEPSEEK_STYLE, notes="sparse attention (lightning indexer)"),
    ArchSpec("glm4_moe", "GLM-4-MoE", **_DEEPSEEK_STYLE),
    ArchSpec("glm4_moe_lite", "GLM-4-MoE-Lite", **_DEEPSEEK_STYLE),
    ArchSpec("dots1", "dots.llm1", **_DEEPSEEK_STYLE),
    ArchSpec(
        "dots3_note_text",
        "dots.note3 (text)",
        **_DEEPSEEK_STYLE,
        notes="sparse attention (lightning indexer)",
    ),
    ArchSpec("sarvam_moe", "Sarvam-MoE", **_DEEPSEEK_STYLE),
    ArchSpec(
        "kimi_linear",
        "Kimi-Linear",
        **_DEEPSEEK_STYLE_NUM,
        notes="hybrid linear attention (Kimi Delta Attention) layers",
    ),
    ArchSpec(
        "mimo_v2_flash",
        "MiMo-V2-Flash",
        **{**_DEEPSEEK_STYLE, "shared_experts": None, "shared_count_key": None},
        notes="no shared experts; sliding-window attention layers",
    ),
    ArchSpec("solar_open", "Solar-Open", **_DEEPSEEK_STYLE),
    ArchSpec(
        "exaone_moe",
        "EXAONE-MoE",
        **_DEEPSEEK_STYLE_NUM,
    ),
    ArchSpec(
        "beam",
        "Beam",
        **{
            **_DEEPSEEK_STYLE_NUM,
            "rule": _sigmoid_grouped_unscaled,
            "shared_experts": None,
            "shared_count_key": None,
        },
        notes="no shared experts; routed output × routed_scaling_factor after the experts",
    ),
    ArchSpec(
        "bailing_hybrid",
        "Bailing-Hybrid",
        **_DEEPSEEK_STYLE_NUM,
        topk_key="num_experts_per_token",
        notes="hybrid linear attention layers",
    ),
    ArchSpec(
        "ernie4_5_moe",
        "ERNIE-4.5-MoE",
        "moe_num_experts",
        "moe_intermediate_size",
        _ernie,
        topk_key="moe_k",
        router_fp32=True,
        correction_bias="gate.moe_statics.e_score_correction_bias",
        shared_experts="shared_experts",
        shared_count_key="moe_num_shared_experts",
    ),
    ArchSpec(
        "minimax_m2",
        "MiniMax-M2",
        "num_local_experts",
        "intermediate_size",
        _sigmoid_bias(),
        correction_bias="e_score_correction_bias",
    ),
    ArchSpec(
        "minimax_m3_vl_text",
        "MiniMax-M3 (text)",
        "num_local_experts",
        "intermediate_size",
        _sigmoid_bias(),
        correction_bias="gate.e_score_correction_bias",
        activation="clamped_swiglu",
        shared_experts="shared_experts",
        shared_intermediate_key="shared_intermediate_size",
        notes="clamped SwiGLU experts (gate-first); routed output × routed_scaling_factor after the experts",
    ),
    ArchSpec(
        "lfm2_moe",
        "LFM2-MoE",
        "num_experts",
        "moe_intermediate_size",
        _lfm2,
        block="feed_forward",
        correction_bias="expert_bias",
        notes="hybrid short-convolution layers",
    ),
    ArchSpec(
        "laguna",
        "Laguna",
        "num_experts",
        "moe_intermediate_size",
        _laguna,
        correction_bias="gate.e_score_correction_bias",
        shared_experts="shared_experts",
        shared_intermediate_key="shared_expert_intermediate_size",
        notes="router logits soft-capped; routed output × moe_routed_scaling_factor after the experts",
    ),
    ArchSpec(
        "kolibri1",
        "Kolibri-1",
        "num_local_experts",
        "moe_intermediate_size",
        _kolibri,
        router_fp32=True,
        correction_bias="gate.e_score_correction_bias",
        shared_experts="shared_experts",
        shared_intermediate_key="shared_expert_intermediate_size",
    ),
    ArchSpec(
        "flint",
        "Flint",
        "num_experts",
        "moe_intermediate_size",
        _sigmoid_topk,
        router_fp32=True,
        shared_experts="shared_expert",
        shared_intermediate_key="shared_expert_intermediate_size",
        notes="shared expert added in full, without a gate",
    ),
    ArchSpec(
        "inkling2_text",
        "Inkling 2 (text)",
        "n_routed_experts",
        "moe_intermediate_size",
        _inkling2,
        **_INKLING2,
        notes="experts' SwiGLU soft-caps the linear gate factor and up (mlp_gate_softcap, mlp_up_softcap)",
    ),
    ArchSpec(
        "inkling2_loop_text",
        "Inkling 2 Loop (text)",
        "n_routed_experts",
        "moe_intermediate_size",
        _inkling2,
        **_INKLING2,
        notes="Inkling 2's experts; layers loop_layer_index_start to _end run loop_num_passes times",
    ),
    ArchSpec(
        "dbrx",
        "DBRX",
        "ffn_config.moe_num_experts",
        "ffn_config.ffn_hidden_size",
        _dbrx,
        topk_key="ffn_config.moe_top_k",
        block="ffn",
        router="router",
        router_weight="layer.weight",
        expert_params="mlp",
        layout="stacked_rows",
        notes="expert settings in ffn_config; w1/v1/w2 [E·I, H], one block of rows per expert",
    ),
    ArchSpec(
        "llama4_text",
        "Llama 4 (text)",
        "num_local_experts",
        "intermediate_size",
        _logits_sigmoid,
        block="feed_forward",
        router="router",
        layout="fused_transposed",
        combine="input",
        shared_experts="shared_expert",
        notes="every expert runs on every token (dense compute); the router score scales the input",
    ),
]

ARCHITECTURES: dict[str, ArchSpec] = {spec.model_type: spec for spec in _SPECS}


def supported_architectures() -> list[str]:
    """Model types moescope supports, in table order."""
    return list(ARCHITECTURES)


def spec_for(config: PretrainedConfig | str) -> ArchSpec:
    """The table row for a config (or a ``model_type``); a clear error for anything else."""
    model_type = config if isinstance(config, str) else getattr(config, "model_type", "")
    if model_type in ARCHITECTURES:
        return ARCHITECTURES[model_type]
    supported = ", ".join(supported_architectures())
    if not isinstance(config, str) and not is_moe_config(config):
        raise UnsupportedArchitectureError(
            f"'{model_type}' is a dense model with no routed experts; moescope needs a "
            f"Mixture-of-Experts model, one of: {supported}."
        )
    text = None if isinstance(config, str) else _text_config(config)
    if text is not None and text.model_type in ARCHITECTURES and model_type not in _WHY_NOT:
        raise UnsupportedArchitectureError(
            f"'{model_type}' is a multimodal config; its language model ('{text.model_type}') is read "
            "through moescope.models.arch.language_config(config)."
        )
    why = f": {_WHY_NOT[model_type]}" if model_type in _WHY_NOT else ""
    raise UnsupportedArchitectureError(
        f"model type '{model_type}' is not supported{why}; use a checkpoint of one of: {supported}."
    )


# MoE model types of transformers that moescope refuses on purpose, and why
_ENCODER_DECODER = "it is an encoder-decoder model, and moescope reads decoder-only causal LMs"
_SHARED_IN_ROUTER = (
    "its router scores the shared experts as extra rows and weighs them together with the chosen "
    "routed experts, which moescope's router-row slicing does not model"
)
_WHY_NOT = {
    "jetmoe": (
        "its attention experts share num_local_experts with its MLP experts, so the MLP experts "
        "cannot be cut alone without changing the attention"
    ),
    "longcat_flash": (
        "its router also chooses zero-computation (identity) experts, which moescope's routing "
        "statistics and export do not model"
    ),
    "zaya": (
        "its router also chooses a skip expert (no computation), which moescope's routing "
        "statistics and export do not model"
    ),
    "deepseek_v4": (
        "its first MoE layers choose experts by token id from a fixed table (tid2eid), which "
        "would name experts a proxy drops"
    ),
    "dots3_note": (
        "its vision tower has routed experts of its own, which moescope does not tell apart from "
        "the language model's in the shards (text-only dots3_note_text checkpoints are supported)"
    ),
    "inkling_text": _SHARED_IN_ROUTER,
    "inkling_mm_model": _SHARED_IN_ROUTER,
    "switch_transformers": _ENCODER_DECODER,
    "nllb-moe": _ENCODER_DECODER,
}


def language_config(config: PretrainedConfig, *, loadable: bool = True) -> PretrainedConfig:
    """The config of the language model moescope reads: ``config`` itself, or, for a multimodal
    checkpoint (Llama 4, Qwen3.5-MoE, Qwen4-Exp), its text model's when that is a supported MoE and
    transformers' ``AutoModelForCausalLM`` loads exactly that language model from the checkpoint.
    A proxy keeps everything else (vision tower, projector) as it is. ``loadable=False`` drops
    the last condition: the text model's config is enough to cost it, not to load it."""
    model_type = getattr(config, "model_type", "")
    if model_type not in ARCHITECTURES and model_type not in _WHY_NOT:
        text = _text_config(config)
        if text is not None and text.model_type in ARCHITECTURES:
            if not loadable or _causal_lm_loads(model_type):
                return text
            raise UnsupportedArchitectureError(
                f"'{model_type}' is a multimodal checkpoint whose language model ('{text.model_type}') "
                "transformers' AutoModelForCausalLM does not load from it; use a text-only checkpoint of "
                "that language model."
            )
    spec_for(config)  # the one-sentence error for anything else
    return config


def _causal_lm_loads(model_type: str) -> bool:
    """Whether ``AutoModelForCausalLM`` maps this (multimodal) model type to its language model."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def _text_config(config: PretrainedConfig) -> PretrainedConfig | None:
    """A multimodal config's text model (``None`` for a text-only or an ambiguous config)."""
    try:
        text = config.get_text_config()
    except (AttributeError, ValueError):  # several text models (encoder-decoder speech models)
        return None
    return text if text is not config and getattr(text, "model_type", None) else None


def is_moe_config(config: PretrainedConfig) -> bool:
    """True when a config declares routed experts under any known key, at its top level or in
    a sub-config (DBRX's ``ffn_config``)."""
    sub = _text_config(config) or config
    parts = [sub, *(getattr(sub, name, None) for name in getattr(sub, "sub_configs", {}))]
    return any(int(getattr(part, key, 0) or 0) > 1 for part in parts if part for key in EXPERT_COUNT_KEYS)


# --- the uniform view --------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert in the Linear convention (``out × in``), whatever the storage.

    ``gate`` and ``up`` are ``(I, H)``, ``down`` is ``(H, I)``; biases are ``None`` unless the
    architecture has them, and ``gate`` is ``None`` for experts without one (Nemotron-H's
    ``down(act(up x))``). Tensors are views of the model's parameters (no copy).
    """

    gate: torch.Tensor | None
    up: torch.Tensor
    down: torch.Tensor
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    def flat(self) -> torch.Tensor:
        """All weights of the expert as one vector (gate, up, down, then biases)."""
        parts = [self.gate, self.up, self.down, self.gate_bias, self.up_bias, self.down_bias]
        return torch.cat([p.reshape(-1) for p in parts if p is not None])


def expert_axis(tensor: torch.Tensor, num_experts: int) -> int:
    """The axis holding one slice per expert: the first (fused weights, router rows), the last
    (correction biases stored ``[E]`` or ``[1, E]``), or the first again when it holds one block
    of rows per expert (DBRX's ``[E·I, H]``)."""
    if tensor.shape[0] == num_experts:
        return 0
    if tensor.shape[-1] == num_experts:
        return tensor.dim() - 1
    if tensor.dim() > 1 and tensor.shape[0] % num_experts == 0:
        return 0
    raise MoescopeError(f"a tensor of shape {tuple(tensor.shape)} has no axis of {num_experts} experts.")


def experts_first(tensor: torch.Tensor, num_experts: int) -> torch.Tensor:
    """A view of ``tensor`` indexed by expert first: ``[E, block, ...]`` along its expert axis."""
    axis = expert_axis(tensor, num_experts)
    return tensor.unflatten(axis, (num_experts, -1)).movedim(axis, 0)


def take_experts(tensor: torch.Tensor, kept: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``tensor`` with only the ``kept`` experts' slices (or blocks of rows), in its own layout."""
    axis = expert_axis(tensor, num_experts)
    return tensor.unflatten(axis, (num_experts, -1)).index_select(axis, kept).flatten(axis, axis + 1)


def _get(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _find(layer: nn.Module, block: nn.Module, path: str | None, *, optional: bool = False) -> Any:
    """The object at a table path; with ``optional``, ``None`` when the last attribute is absent
    (Cohere2-MoE builds no ``shared_experts`` module when it has none)."""
    if path is None:
        return None
    root, path = (layer, path[1:]) if path.startswith("^") else (block, path)
    parent, _, name = path.rpartition(".")
    owner = _get(root, parent) if parent else root
    return getattr(owner, name, None) if optional else getattr(owner, name)


@dataclass(frozen=True)
class MoELayer:
    """One MoE decoder layer of a loaded model, read through its :class:`ArchSpec`."""

    index: int  # position of the decoder layer in the model
    layer: nn.Module
    block: nn.Module
    spec: ArchSpec
    rule: RoutingRule
    activation_fn: Callable[..., torch.Tensor] = field(repr=False)  # of gate; of gate and up if paired

    @property
    def router(self) -> nn.Module:
        return _get(self.block, self.spec.router)

    @property
    def experts(self) -> nn.Module:
        """The module the block calls with the routed tokens (hooked to see routing)."""
        return _get(self.block, self.spec.experts)

    @property
    def expert_module(self) -> nn.Module:
        """The module holding the expert tensors: ``experts`` itself, or DBRX's ``experts.mlp``."""
        experts = self.experts
        return experts if self.spec.expert_params is None else _get(experts, self.spec.expert_params)

    @property
    def router_weight(self) -> torch.Tensor:
        """``(E, H)`` router matrix."""
        return _get(self.router, self.spec.router_weight)

    @property
    def router_bias(self) -> torch.Tensor | None:
        """``(E,)`` bias added to the router logits (GPT-OSS), else ``None``."""
        return _find(self.layer, self.router, self.spec.router_bias)

    @property
    def correction_bias(self) -> torch.Tensor | None:
        """``(E,)`` selection-only bias (DeepSeek-V3 ``e_score_correction_bias``), else ``None``."""
        bias = _find(self.layer, self.block, self.spec.correction_bias)
        return None if bias is None else bias.reshape(-1)

    @property
    def shared_experts(self) -> nn.Module | None:
        return _find(self.layer, self.block, self.spec.shared_experts, optional=True)

    @property
    def shared_gate(self) -> nn.Module | None:
        return _find(self.layer, self.block, self.spec.shared_gate, optional=True)

    @property
    def num_experts(self) -> int:
        return self.router_weight.shape[0]

    @property
    def top_k(self) -> int:
        return self.rule.top_k

    def router_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(T, E)`` raw logits for ``(T, H)`` hidden states, as the router computes them."""
        weight = self.router_weight
        if self.spec.router_fp32:
            weight = weight.float()
        return cap_logits(nn.functional.linear(hidden.to(weight.dtype), weight, self.router_bias), self.rule)

    def router_choice(self, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [T, E], index [T, k])`` from what this layer's router module returned.

        Most routers return ``(logits, weights, index)``; Llama 4's returns dense sigmoid scores
        and the logits, and the top-k of the logits is its own choice; DBRX's returns the logits
        alone, and its block's choice (top-k of their softmax, in their dtype) is taken the same way.
        """
        if isinstance(out, torch.Tensor):  # DBRX: the block takes top-k of the softmax itself
            probs = torch.softmax(out.detach(), dim=1, dtype=out.dtype)
            return out, torch.topk(probs, self.top_k, dim=-1).indices
        if self.spec.combine == "output":
            logits, _, index = out
            return logits, index
        _scores, logits = out
        return logits, torch.topk(logits.detach(), self.top_k, dim=1).indices

    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits [T, E], weights [T, k], index [T, k])`` for ``(T, H)`` hidden states."""
        logits = self.router_logits(hidden)
        weights, index = route(logits, self.rule, self.correction_bias)
        return logits, weights, index

    def expert(self, i: int) -> ExpertWeights:
        """Expert ``i`` in the uniform ``(gate, up, down)`` view."""
        ex = self.expert_module
        if self.spec.layout == "up_down":  # up [I, H], down [H, I]: no gate
            return ExpertWeights(None, ex.up_proj[i], ex.down_proj[i])
        if self.spec.layout == "stacked_rows":  # w1 (gate), v1 (up), w2 (down, transposed) [E·I, H]
            gate, up, down = (t.unflatten(0, (self.num_experts, -1))[i] for t in (ex.w1, ex.v1, ex.w2))
            return ExpertWeights(gate, up, down.T)
        gate_up, down = ex.gate_up_proj[i], ex.down_proj[i]
        bias = getattr(ex, "gate_up_proj_bias", None)
        down_bias = getattr(ex, "down_proj_bias", None)
        layout = self.spec.layout
        if layout == "fused":  # [2I, H]: gate rows, then up rows
            gate, up = gate_up.chunk(2, dim=0)
            gate_b, up_b = bias[i].chunk(2) if bias is not None else (None, None)
        elif layout == "fused_transposed":  # [H, 2I]: gate columns, then up columns
            gate, up = (t.T for t in gate_up.chunk(2, dim=1))
            gate_b, up_b = bias[i].chunk(2) if bias is not None else (None, None)
            down = down.T
        else:  # [H, 2I] with gate/up interleaved column by column
            gate, up = gate_up[:, 0::2].T, gate_up[:, 1::2].T
            gate_b, up_b = (bias[i][0::2], bias[i][1::2]) if bias is not None else (None, None)
            down = down.T
        return ExpertWeights(gate, up, down, gate_b, up_b, None if down_bias is None else down_bias[i])

    def expert_forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Output of expert ``i`` on ``(T, H)`` inputs, before any routing weight.

        A latent MoE (Nemotron-H with ``moe_latent_size``) runs its experts in a smaller space
        the block projects into and out of; the projections are applied here too, so the result
        is the expert's contribution in the hidden space either way.
        """
        w = self.expert(i)
        into, out_of = (
            _find(self.layer, self.block, path) for path in (self.spec.latent_in, self.spec.latent_out)
        )
        x = x if into is None else into(x)
        up = nn.functional.linear(x, w.up, w.up_bias)
        if w.gate is None:
            hidden = self.activation_fn(up)
        else:
            hidden = self._glu(nn.functional.linear(x, w.gate, w.gate_bias), up)
        y = nn.functional.linear(hidden, w.down, w.down_bias)
        return y if out_of is None else out_of(y)

    def _glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.spec.activation == "clamped_swiglu":  # GPT-OSS; MiniMax-M3 names its alpha swiglu_alpha
            ex = self.experts
            alpha = getattr(ex, "alpha", None) or ex.swiglu_alpha
            gate = gate.clamp(max=ex.limit)
            up = up.clamp(min=-ex.limit, max=ex.limit)
            return (up + 1) * gate * torch.sigmoid(gate * alpha)
        if self.spec.activation == "paired":  # the experts' own act_fn combines both (Inkling 2)
            return self.activation_fn(gate, up)
        return self.activation_fn(gate) * up

    def shared_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """``(T, H)``: what the shared experts *inside the block* add to its output (gated where
        the architecture gates them, halved where it averages them with the routed output), or
        ``None``; GraniteMoE-Shared keeps its shared MLP on the decoder layer."""
        if self.shared_experts is None or (self.spec.shared_experts or "").startswith("^"):
            return None
        out = self.shared_experts(x)
        gate = self.shared_gate
        if self.spec.shared_combine and _find(self.layer, self.block, self.spec.shared_combine) == "average":
            out = out / 2
        return out if gate is None else torch.sigmoid(gate(x)) * out

    def block_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stock MoE block on ``(T, H)`` inputs, as ``(T, H)`` (blocks that also return
        router outputs, GPT-OSS and Llama 4, are unwrapped)."""
        out = self.block(x.unsqueeze(0))
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(x.shape)

    def named_expert_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor with one slice per routed expert on some axis, by attribute path.

        Router rows, router bias, correction bias and the fused expert tensors: the tensors
        expert pruning must slice.
        """
        path = ".".join(p for p in (self.spec.experts, self.spec.expert_params) if p)
        for name, param in self.expert_module.named_parameters(recurse=False):
            yield f"{path}.{name}", param
        yield f"{self.spec.router}.{self.spec.router_weight}", self.router_weight
        if self.spec.router_bias:
            yield f"{self.spec.router}.{self.spec.router_bias}", self.router_bias
        if self.spec.correction_bias:
            yield self.spec.correction_bias, _find(self.layer, self.block, self.spec.correction_bias)


@dataclass(frozen=True)
class MoEModel:
    """A loaded causal LM seen through its architecture row."""

    model: PreTrainedModel
    spec: ArchSpec
    layers: tuple[MoELayer, ...]
    dense_layers: tuple[int, ...]

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def num_layers(self) -> int:
        return len(self.layers) + len(self.dense_layers)

    @property
    def num_experts(self) -> int:
        return self.spec.num_experts(self.config)

    @property
    def top_k(self) -> int:
        return self.layers[0].rule.top_k if self.layers else self.spec.top_k(self.config)

    @cached_property
    def rule(self) -> RoutingRule:
        return self.spec.rule(self.config)

    def layer(self, index: int) -> MoELayer:
        """The MoE layer at decoder position ``index``."""
        for moe_layer in self.layers:
            if moe_layer.index == index:
                return moe_layer
        raise KeyError(f"decoder layer {index} is not an MoE layer; MoE layers: {self.moe_indices}")

    @property
    def moe_indices(self) -> list[int]:
        return [moe_layer.index for moe_layer in self.layers]


def decoder_model(model: nn.Module) -> nn.Module:
    """The base model under a causal LM's head: ``model.model``, or DBRX's ``model.transformer``."""
    for name in ("model", "transformer"):
        base = getattr(model, name, None)
        if isinstance(base, nn.Module):
            return base
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder stack of a causal LM (``model.model.layers``; DBRX's ``transformer.blocks``)."""
    base = decoder_model(model)
    layers = getattr(base, "layers", None)
    layers = getattr(base, "blocks", None) if layers is None else layers
    if layers is None:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} has no decoder layer stack at .model.layers; load the model "
            "with AutoModelForCausalLM."
        )
    return layers


# the expert tensor whose presence tells an MoE layer from a dense one, by layout
_FIRST_EXPERT_TENSOR: dict[str, str] = {
    "fused": "gate_up_proj",
    "fused_transposed": "gate_up_proj",
    "fused_transposed_interleaved": "gate_up_proj",
    "up_down": "up_proj",
    "stacked_rows": "w1",
}


def adapt(model: PreTrainedModel) -> MoEModel:
    """Read a loaded causal LM through its architecture row.

    Raises :class:`~moescope.errors.UnsupportedArchitectureError` for dense or unknown models.
    """
    spec = spec_for(model.config)
    rule = spec.rule(model.config)
    moe, dense = [], []
    for index, layer in enumerate(decoder_layers(model)):
        block = getattr(layer, spec.block, None)
        experts = getattr(block, spec.experts, None) if block is not None else None
        params = _find(layer, experts, spec.expert_params, optional=True) if experts is not None else None
        if not hasattr(params or experts, _FIRST_EXPERT_TENSOR[spec.layout]):
            dense.append(index)
            continue
        act = (
            getattr(params or experts, "act_fn", None) or getattr(params, "activation_fn", None) or nn.SiLU()
        )
        moe.append(MoELayer(index, layer, block, spec, rule, act))
    if not moe:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} has no MoE layers in this configuration; check the config's "
            "dense-layer settings (e.g. first_k_dense_replace, mlp_only_layers)."
        )
    return MoEModel(model, spec, tuple(moe), tuple(dense))
