"""Which model parameter a checkpoint key loads into, as ``from_pretrained`` decides it.

transformers 5 renames stored keys (``WeightRenaming``) and joins or splits some tensors on
loading (``WeightConverter``: per-expert tensors stacked into one fused parameter, ``qkv``
chunked, ...). Both the streaming export (:mod:`moescope.export.streaming.keys`) and the
layer-sequential calibration (:mod:`moescope.models.layer_weights`) read checkpoints key by key,
so they ask transformers' own tables here rather than keep a second one.
"""

from __future__ import annotations

from typing import Any


def conversions(model: Any) -> tuple[list[Any], list[Any]]:
    """transformers' renamings and converters for this model, as ``from_pretrained`` gathers them."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    return renamings, [t for t in transforms if isinstance(t, WeightConverter)]


def rename(key: str, renamings: list, converters: list, model: Any, state: dict) -> tuple[str, str | None]:
    """The parameter a checkpoint key loads into, and the converter pattern it matched (if any).

    ``state`` is the model's ``state_dict()`` (on the meta device is enough).
    """
    from transformers.core_model_loading import rename_source_key

    prefix = model.base_model_prefix
    target, pattern = rename_source_key(key, renamings, converters, prefix, state)
    if target not in state and key in state:  # the loader's own fallback: the key needs no renaming
        target, pattern = rename_source_key(key, [], [], prefix, state)
    return target, pattern


def converter_for(converters: list, pattern: str) -> Any:
    """The converter whose source patterns include ``pattern``."""
    return next(c for c in converters if pattern in c.source_patterns)
