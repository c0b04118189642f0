"""The architecture table: one declarative row per supported transformers MoE model type.

Each :class:`ArchSpec` row says where a decoder layer keeps its MoE block, router, experts,
biases and shared experts, which config keys hold the expert count and top-k, which routing
rule its router follows (:mod:`moescope.models.rules`), and how its expert tensors are laid out.
:func:`moescope.models.support.spec_for` finds a config's row, or says why there is none.

Examples
--------
>>> ARCHITECTURES["mixtral"].name, ARCHITECTURES["deepseek_v3"].count_key
('Mixtral', 'n_routed_experts')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

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
