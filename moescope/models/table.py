"""The architecture table: one declarative row per supported transformers MoE model type.

Each :class:`ArchSpec` row says where a decoder layer keeps its MoE block, router, experts,
biases and shared experts, which config keys hold the expert count and top-k, which routing
rule its router follows (:mod:`moescope.models.rules`), and how its expert tensors are laid out.
:func:`spec_for` finds a config's row, or says in one sentence why there is none (a dense model,
an MoE refused on purpose, a multimodal wrapper read through :func:`language_config`).

Examples
--------
>>> spec_for("mixtral").name, spec_for("deepseek_v3").count_key
('Mixtral', 'n_routed_experts')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from moescope.errors import UnsupportedArchitectureError
from moescope.models import rules
from moescope.models.routers import RoutingRule

if TYPE_CHECKING:
    from transformers import PretrainedConfig

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


# --- the table ---------------------------------------------------------------------------------

_DEEPSEEK_STYLE = dict(
    count_key="n_routed_experts",
    intermediate_key="moe_intermediate_size",
    rule=rules.sigmoid_grouped,
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
    rule=rules.logits_softmax,
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
    ArchSpec("mixtral", "Mixtral", "num_local_experts", "intermediate_size", rules.softmax_topk(True)),
    ArchSpec("minimax", "MiniMax-Text", "num_local_experts", "intermediate_size", rules.softmax_topk(True)),
    ArchSpec(
        "qwen2_moe",
        "Qwen2-MoE",
        "num_experts",
        "moe_intermediate_size",
        rules.softmax_topk("norm_topk_prob"),
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "qwen3_moe",
        "Qwen3-MoE",
        "num_local_experts",
        "moe_intermediate_size",
        rules.softmax_topk("norm_topk_prob"),
    ),
    ArchSpec(
        "qwen3_next",
        "Qwen3-Next",
        "num_experts",
        "moe_intermediate_size",
        rules.softmax_topk("norm_topk_prob"),
        notes="hybrid linear attention (Gated DeltaNet) layers",
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "qwen3_5_moe_text",
        "Qwen3.5-MoE (text)",
        "num_experts",
        "moe_intermediate_size",
        rules.softmax_topk(True),
        notes="hybrid linear attention (Gated DeltaNet) layers",
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "qwen4_exp_text",
        "Qwen4-Exp (text)",
        "num_experts",
        "moe_intermediate_size",
        rules.softmax_topk("norm_topk_prob"),
        notes="hybrid linear and indexed attention layers; hyper-connections, n-gram embeddings",
        **_QWEN_SHARED,
    ),
    ArchSpec(
        "lara_mini",
        "Lara-Mini",
        "num_experts",
        "moe_intermediate_size",
        rules.softmax_topk("norm_topk_prob"),
        router_fp32=True,
        shared_experts="shared_expert",
        shared_intermediate_key="shared_expert_intermediate_size",
    ),
    ArchSpec(
        "mellum", "Mellum", "num_local_experts", "moe_intermediate_size", rules.softmax_topk("norm_topk_prob")
    ),
    ArchSpec(
        "aria_text",
        "Aria (text)",
        "moe_num_experts",
        "intermediate_size",
        rules.aria,
        topk_key="moe_topk",
        router="router",
        layout="fused_transposed",
        shared_experts="shared_experts",
        shared_count_key="moe_num_shared_experts",
    ),
    ArchSpec("olmoe", "OLMoE", "num_experts", "intermediate_size", rules.softmax_topk("norm_topk_prob")),
    ArchSpec(
        "flex_olmo", "FlexOlmo", "num_experts", "intermediate_size", rules.softmax_topk("norm_topk_prob")
    ),
    ArchSpec(
        "hunyuan_v1_moe",
        "HunYuan-MoE-V1",
        "num_experts",
        "intermediate_size",
        rules.hunyuan,
        topk_key="moe_topk",
        router_weight="wg.weight",
        shared_experts="shared_mlp",
    ),
    ArchSpec(
        "jamba",
        "Jamba",
        "num_experts",
        "intermediate_size",
        rules.softmax_topk(False),
        block="feed_forward",
        router="router",
        notes="hybrid Mamba layers; MoE every expert_layer_period layers",
    ),
    ArchSpec(
        "phimoe",
        "PhiMoE",
        "num_local_experts",
        "intermediate_size",
        rules.phimoe,
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
        rules.cohere2,
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
        rules.sigmoid_bias(1e-20, "route_scale"),
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
        rules.logits_softmax,
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
        rules.deepseek_v2,
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
        rules.sigmoid_bias(1e-20, "router_scaling_factor"),
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
            "rule": rules.sigmoid_grouped_unscaled,
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
        rules.ernie,
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
        rules.sigmoid_bias(),
        correction_bias="e_score_correction_bias",
    ),
    ArchSpec(
        "minimax_m3_vl_text",
        "MiniMax-M3 (text)",
        "num_local_experts",
        "intermediate_size",
        rules.sigmoid_bias(),
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
        rules.lfm2,
        block="feed_forward",
        correction_bias="expert_bias",
        notes="hybrid short-convolution layers",
    ),
    ArchSpec(
        "laguna",
        "Laguna",
        "num_experts",
        "moe_intermediate_size",
        rules.laguna,
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
        rules.kolibri,
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
        rules.sigmoid_topk,
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
        rules.inkling2,
        **_INKLING2,
        notes="experts' SwiGLU soft-caps the linear gate factor and up (mlp_gate_softcap, mlp_up_softcap)",
    ),
    ArchSpec(
        "inkling2_loop_text",
        "Inkling 2 Loop (text)",
        "n_routed_experts",
        "moe_intermediate_size",
        rules.inkling2,
        **_INKLING2,
        notes="Inkling 2's experts; layers loop_layer_index_start to _end run loop_num_passes times",
    ),
    ArchSpec(
        "dbrx",
        "DBRX",
        "ffn_config.moe_num_experts",
        "ffn_config.ffn_hidden_size",
        rules.dbrx,
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
        rules.logits_sigmoid,
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
            "through moescope.models.table.language_config(config)."
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
    checkpoint (e.g. Llama 4), its text model's when that is a supported MoE and
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
