"""Tiny random models of every supported architecture, built from config with no download.

They are real ``transformers`` classes at toy width (hidden 64, 8 experts, top-2, a few
layers), so tests and notebook defaults exercise the same code paths as full-size
checkpoints in well under a second each.

Examples
--------
>>> model = tiny("deepseek_v3")
>>> type(model).__name__
'DeepseekV3ForCausalLM'
>>> tiny_config("qwen2_moe", num_experts=16).num_experts
16
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from moescope.models.support import spec_for
from moescope.models.table import ARCHITECTURES
from moescope.models.view import adapt

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

# Applied when the architecture's config has the field.
_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 64,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "shared_intermediate_size": 48,
    "vocab_size": 128,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

# Small Multi-head Latent Attention for the DeepSeek family (MLA expects as many KV heads as heads).
_MLA = {
    "num_key_value_heads": 4,
    "head_dim": 8,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
}

# DeepSeek-V3 routing with a small sparse-attention indexer (DeepSeek-V3.2, GLM-MoE-DSA).
_DSA = {
    "n_routed_experts": 16,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 2,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 4,
}

# A dense first layer, then MoE layers whose 8 experts route in 2 groups, the best 1 chosen.
_DENSE_FIRST_GROUPED = {"num_hidden_layers": 3, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1}
# Inkling 2's sliding-window layers have their own head counts; the experts' soft-caps made
# small enough to bite on tiny activations
_INKLING2 = {
    "mlp_gate_softcap": 0.05,
    "mlp_up_softcap": 0.05,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 2,
    "swa_head_dim": 16,
    "sliding_window_size": 16,
}

# Per-architecture settings: leading dense layers and grouped routing are exercised on purpose.
_TINY: dict[str, dict[str, Any]] = {
    # 16 experts in 4 groups: a proxy can keep 2 per group and stay group-limited
    "deepseek_v3": {
        **_MLA,
        "n_routed_experts": 16,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.5,
    },
    "deepseek_v32": {**_MLA, **_DSA},
    "glm_moe_dsa": {**_MLA, **_DSA},
    "deepseek_v2": {
        **_MLA,
        "n_routed_experts": 16,
        "topk_method": "group_limited_greedy",
        "n_group": 4,
        "topk_group": 1,
    },
    "glm4_moe": _DENSE_FIRST_GROUPED,
    "glm4_moe_lite": {**_MLA, "num_hidden_layers": 3, "first_k_dense_replace": 1},
    "dots1": {"num_hidden_layers": 3, "first_k_dense_replace": 1, "n_shared_experts": 1},
    "sarvam_mla": {**_MLA, **_DENSE_FIRST_GROUPED},
    "axk1": {**_MLA, **_DENSE_FIRST_GROUPED},
    "axk2": {**_MLA, "num_hidden_layers": 3, "first_k_dense_replace": 1},
    "hy_v4": {**_MLA, "num_hidden_layers": 3, "n_group": 2, "topk_group": 1, "index_topk": 4},
    "hy_v3": {"num_hidden_layers": 3},
    "sarvam_moe": _DENSE_FIRST_GROUPED,
    "mimo_v2_flash": {"num_hidden_layers": 3, "n_group": 2, "topk_group": 1},
    "afmoe": {"num_hidden_layers": 3, "num_dense_layers": 1, "num_shared_experts": 1, "route_scale": 2.0},
    "exaone_moe": {"num_hidden_layers": 3, "first_k_dense_replace": 1},
    "ernie4_5_moe": {"num_hidden_layers": 3, "moe_layer_start_index": 1},
    "lfm2_moe": {
        "num_hidden_layers": 3,
        "num_dense_layers": 1,
        "layer_types": ["conv", "full_attention", "conv"],
    },
    "jamba": {
        "num_hidden_layers": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "attn_layer_period": 2,
        "attn_layer_offset": 0,
    },
    # its own names for the common fields (attribute_map aliases do not reach __init__)
    "dbrx": {
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "max_seq_len": 128,
        "attn_config.kv_n_heads": 2,
        # DBRX reads both there and its default attn_config lacks them (as published: 500000, 8)
        "attn_config.rope_theta": 10000.0,
        "attn_config.clip_qkv": 8.0,
    },
    # hybrid stacks: one linear-attention / Mamba layer and one attention layer
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"]},
    "qwen3_5_moe_text": {"layer_types": ["linear_attention", "full_attention"]},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"]},
    "kimi_linear": {
        **_MLA,
        "num_hidden_layers": 3,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "linear_num_heads": 4,
        "linear_head_dim": 16,
    },
    "cohere2_moe": {"num_shared_experts": 1},
    "nemotron_h": {
        "layers_block_type": ["mamba", "moe", "attention", "moe"],
        "n_groups": 1,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "ssm_state_size": 16,
        "chunk_size": 16,
        "moe_shared_expert_intermediate_size": 48,
        "n_group": 2,
        "topk_group": 1,
    },
    "beam": {
        "num_hidden_layers": 3,
        "mlp_layer_types": ["dense", "sparse", "sparse"],
        "n_group": 2,
        "topk_group": 1,
    },
    "bailing_hybrid": {
        **_MLA,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "num_expert_group": 2,
        "topk_group": 1,
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "linear_num_heads": 4,
        "linear_head_dim": 16,
    },
    "flint": {"num_hidden_layers": 3, "mlp_only_layers": [0]},
    # logits capped at ±2 (random tiny logits reach it) and the routed output scaled
    "laguna": {
        "num_hidden_layers": 3,
        "num_attention_heads_per_layer": [4, 4, 4],
        "moe_router_logit_softcapping": 2.0,
        "moe_routed_scaling_factor": 2.0,
    },
    "inkling2_text": _INKLING2,
    # four layers, the middle two looped twice: every pass routes again through the same modules
    "inkling2_loop_text": {
        **_INKLING2,
        "num_hidden_layers": 4,
        "n_layers_per_attn_res_block": 1,
        "loop_layer_index_start": 1,
        "loop_layer_index_end": 3,
        "loop_num_passes": 2,
        "loop_gate_rank": 8,
    },
    # its sliding-window layers take their own attention sizes (per_layer_config), small here too
    "dots3_note_text": {
        **_MLA,
        **_DSA,
        "mlp_layer_types": ["dense", "sparse", "sparse"],
        "layer_types": ["indexed_attention", "indexed_attention", "sliding_attention"],
        "sliding_window": 16,
        "head_dim": 16,  # a sliding-window layer's: qk_nope_head_dim + qk_rope_head_dim
        "per_layer_config": {
            "02": {
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "kv_lora_rank": 8,
                "qk_nope_head_dim": 8,
            }
        },
    },
    "minimax_m3_vl_text": {
        "rotary_dim": 8,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_block_size": 4,
        "index_topk_blocks": 2,
        # a limit tiny activations reach, so the clamps are exercised
        "swiglu_limit": 0.1,
    },
    # a linear-attention and an indexed-attention layer, small n-gram tables and hyper-connections
    "qwen4_exp_text": {
        "layer_types": ["linear_attention", "indexed_attention"],
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "hc_lowrank": 8,
        "ple_embed_dim": 64,
        "ngram_vocab_size_base": 256,
        "split_ngram_parts": 2,
        "heads_per_ngram": 2,
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 8,
        "indexer_compress_ratio": 2,
    },
    "qwen2_moe": {"norm_topk_prob": False},
    "qwen3_moe": {"norm_topk_prob": True},
}


def tiny_config(arch: str, **overrides: Any) -> PretrainedConfig:
    """Config of a tiny model of ``arch`` (a supported ``model_type``); ``overrides`` win."""
    from transformers import AutoConfig

    spec = spec_for(arch)
    defaults = AutoConfig.for_model(arch).to_dict()
    values = {key: value for key, value in _COMMON.items() if key in defaults}
    values.update({spec.count_key: 8, spec.topk_key: 2, spec.intermediate_key: 32})
    if spec.intermediate_key != "intermediate_size" and "intermediate_size" in defaults:
        values["intermediate_size"] = 64  # dense layers
    values.update(_TINY.get(arch, {}))
    values.update(overrides)
    if "unpadded_vocab_size" in defaults and "unpadded_vocab_size" not in overrides:
        values["unpadded_vocab_size"] = values["vocab_size"]  # Inkling 2's LM head: no padding rows
    values = _nested(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model(arch, **values)


def _nested(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys (``ffn_config.moe_num_experts``) gathered into their sub-config's dict."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, _, rest = key.partition(".")
        if rest:
            out.setdefault(head, {})[rest] = value
        else:
            out[key] = value
    return out


def tiny(arch: str, *, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """A tiny random model of ``arch`` in eval mode, float32, seeded without touching global RNG.

    Parameters
    ----------
    arch : a supported ``model_type`` (see :func:`moescope.models.table.supported_architectures`).
    seed : weight initialization seed.
    overrides : config fields, e.g. ``num_experts=16`` under the architecture's own key.
    """
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _draw_zero_routers(model)
    return model.eval()


# tiny vision towers of multimodal checkpoints whose language model is supported
_QWEN_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": _COMMON["hidden_size"],
}
_TINY_VISION: dict[str, dict[str, Any]] = {
    "llama4": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
        "projector_input_dim": 32,
        "projector_output_dim": 32,
        "vision_output_dim": 32,
    },
    "qwen3_5_moe": _QWEN_VISION,
    "qwen4_exp": _QWEN_VISION,
}
TINY_MULTIMODAL: tuple[str, ...] = tuple(_TINY_VISION)


def tiny_multimodal(wrapper: str, *, seed: int = 0) -> PreTrainedModel:
    """A tiny random multimodal model (``llama4``, ``qwen3_5_moe``, ``qwen4_exp``) whose language model is
    ``tiny(<its text type>)``'s config, with a one-layer vision tower, in eval mode, float32."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    if wrapper not in _TINY_VISION:
        raise ValueError(
            f"no tiny multimodal model of {wrapper!r}; choose one of {', '.join(TINY_MULTIMODAL)}."
        )
    text_type = AutoConfig.for_model(wrapper).get_text_config().model_type
    text = tiny_config(text_type).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(wrapper, text_config=text, vision_config=_TINY_VISION[wrapper])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    return model.eval()


def _draw_zero_routers(model: PreTrainedModel) -> None:
    """Give routers that start at zero (AFMoE's) random rows, as for every other architecture.

    A zero router scores every expert alike, so its top-k is decided by ties; a trained router
    never is, and tests of routing need the choices to depend on the token.
    """
    std = float(getattr(model.config, "initializer_range", 0.02))
    with torch.no_grad():
        for layer in adapt(model).layers:
            if not layer.router_weight.any():
                layer.router_weight.normal_(0.0, std)


TINY_ARCHS: tuple[str, ...] = tuple(ARCHITECTURES)
