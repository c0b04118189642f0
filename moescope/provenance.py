"""Provenance shared by every artifact: which model a result was computed from.

A selection, a proxy manifest or a trace records the source model's *config hash*, so a
file alone says what it belongs to and a selection made for another model is refused.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Fields that change with the saving library or the loading call, not with the model.
_VOLATILE = {
    "transformers_version",
    "_name_or_path",
    "name_or_path",
    "_attn_implementation",
    "_experts_implementation",
    "_attn_implementation_autoset",
    "dtype",
    "torch_dtype",
    "output_router_logits",
    "use_cache",
    "architectures",
}


def config_hash(config: PretrainedConfig | dict[str, Any]) -> str:
    """Short stable hash of a model config (what defines the architecture and its sizes).

    Examples
    --------
    >>> config_hash({"model_type": "mixtral", "hidden_size": 64}) == config_hash(
    ...     {"hidden_size": 64, "model_type": "mixtral", "transformers_version": "5.24.0"})
    True
    """
    values = config if isinstance(config, dict) else config.to_dict()
    kept = {k: v for k, v in values.items() if k not in _VOLATILE and not k.startswith("_")}
    canonical = json.dumps(kept, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def library_versions() -> dict[str, str]:
    """Versions of moescope and the libraries whose numerics it depends on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("moescope", "torch", "transformers", "safetensors", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out
