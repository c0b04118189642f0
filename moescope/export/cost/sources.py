"""Reading what a cost is asked of: an embedded model's name, a checkpoint directory, a ``config.json``, a
Hugging Face config; each refusal says in one sentence what to pass instead."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.io import read_json_object
from moescope.errors import MoescopeError
from moescope.models.embedded import is_embedded
from moescope.models.loading import resolve_model

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from moescope.models.summary import ModelSummary


def read_source(source: str | Path) -> tuple[dict[str, Any], str]:
    """The JSON of an embedded model (``"toy"``, ``"toy-v3"``), a checkpoint directory or a config
    file, and a name for it."""
    if is_embedded(source):
        return _read_json(resolve_model(source) / "config.json"), str(source)
    path = Path(source).expanduser()
    if not path.exists():
        raise MoescopeError(
            f"no such file or directory: {path}; pass a checkpoint directory, a config.json, 'toy' "
            "or a published model's name (moescope cost --reference lists them)."
        )
    if path.is_dir():
        return _read_json(resolve_model(path) / "config.json"), path.name
    data = _read_json(path)
    if "model_type" not in data and "routed_experts" not in data:
        raise not_a_config(str(path))
    return data, path.parent.name if path.name == "config.json" else path.stem


def not_a_config(what: str) -> MoescopeError:
    """The refusal of a JSON document that is no model config."""
    return MoescopeError(
        f"{what} is not a model config: it has neither 'model_type' (a Hugging Face config.json) nor "
        "'routed_experts' (a moe_configs.json entry); pass a checkpoint's config.json."
    )


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json_object(path, "pass a model's config.json")
    if "models" in data and "model_type" not in data:
        raise MoescopeError(
            f"{path} lists several models; pass one model's config.json, or --reference for moescope's list."
        )
    return data


def hf_config(data: Mapping[str, Any], name: str | None) -> PretrainedConfig:
    """The transformers config of a ``config.json``'s data; refused when transformers cannot read it."""
    from transformers import CONFIG_MAPPING  # torch and transformers load only when a config is costed

    from moescope.models.table import supported_architectures

    model_type = str(data["model_type"])
    if model_type not in CONFIG_MAPPING:
        raise MoescopeError(
            f"model_type '{model_type}' is not a transformers architecture; pass the config of a stock "
            f"transformers MoE model, one of: {', '.join(supported_architectures())}."
        )
    from huggingface_hub.errors import StrictDataclassError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config_class = CONFIG_MAPPING[model_type]
            # config.json spells inf/nan as {"__float__": "Infinity"}; decode them as from_pretrained does
            return config_class.from_dict(config_class._decode_special_floats(dict(data)))
    except (ValueError, TypeError, KeyError, StrictDataclassError) as exc:
        why = str(exc).splitlines()[0]
        raise MoescopeError(f"transformers cannot read the config of {name or model_type} ({why}).") from None


def moe_text_config(config: PretrainedConfig) -> tuple[PretrainedConfig, str]:
    """The config itself, or the text model of a multimodal one; checked to be a supported MoE."""
    from moescope.models.support import language_config  # torch: costing a published model needs none

    text = language_config(config, loadable=False)  # a dense or unknown model fails here, in one sentence
    if text is config:
        return config, ""
    return text, f"text model of {config.model_type} only; the vision tower is not counted"


def meta_summary(config: PretrainedConfig, name: str) -> ModelSummary:
    """The model's summary, built on the meta device (no weight read)."""
    from moescope.models.summary import summarize  # torch: costing a published model needs none

    try:
        return summarize(config)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError) as exc:
        raise MoescopeError(f"transformers cannot build {name} from its config ({exc}).") from None
