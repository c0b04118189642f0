"""Which configs moescope reads, and why not the others.

:func:`spec_for` finds a config's row of the architecture table (:mod:`moescope.models.table`), or
says in one sentence why there is none: a dense model, an MoE refused on purpose (with the reason),
or a multimodal wrapper whose language model :func:`language_config` reads.

Examples
--------
>>> spec_for("mixtral").name, spec_for("deepseek_v3").count_key
('Mixtral', 'n_routed_experts')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moescope.errors import UnsupportedArchitectureError
from moescope.models.table import ARCHITECTURES, EXPERT_COUNT_KEYS, ArchSpec, supported_architectures

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["is_moe_config", "language_config", "spec_for"]


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
            "through moescope.models.support.language_config(config)."
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
