"""A checkpoint seen through its shard headers: checked against its config, mapped to experts.

:func:`open_checkpoint` reads ``config.json`` and every safetensors header (never a weight), builds
the model on the meta device for its shapes and architecture row, and says which stored tensor
belongs to which routed expert (:mod:`moescope.export.streaming.keys`).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moescope.errors import ModelLoadError
from moescope.export.streaming.keys import ExpertKey, map_experts
from moescope.export.streaming.shards import StoredTensor, read_header
from moescope.models.loading import INDEX_FILE, check_weights, load_config, resolve_model
from moescope.models.view import MoEModel, adapt

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint seen through its shard headers and its model built on the meta device.

    Attributes
    ----------
    path : the checkpoint directory.
    moe : the model on the meta device (architecture row, shapes, config; no weights).
    tensors : every stored tensor, in file order then byte order (the order the pass reads).
    experts : checkpoint key → :class:`~moescope.export.streaming.keys.ExpertKey` for every tensor
        tied to routed experts; the others are copied unchanged.
    metadata : the ``__metadata__`` entries every source shard shares (``format: pt``).
    """

    path: Path
    moe: MoEModel
    tensors: list[StoredTensor] = field(repr=False)
    experts: dict[str, ExpertKey] = field(repr=False)
    metadata: dict[str, str]

    @cached_property
    def by_key(self) -> dict[str, StoredTensor]:
        return {tensor.key: tensor for tensor in self.tensors}

    @cached_property
    def layer_keys(self) -> dict[int, list[str]]:
        """MoE layer → keys of its expert tensors (router and biases included), in file order."""
        keys: dict[int, list[str]] = {layer: [] for layer in self.moe.moe_indices}
        for tensor in self.tensors:
            if tensor.key in self.experts:
                keys[self.experts[tensor.key].layer].append(tensor.key)
        return keys

    @cached_property
    def layer_bytes(self) -> int:
        """Bytes of the largest MoE layer's expert tensors: what a pass holding one layer holds."""
        sizes = [sum(self.by_key[key].nbytes for key in keys) for keys in self.layer_keys.values()]
        return max(sizes, default=0)


def open_checkpoint(model: str | Path) -> Checkpoint:
    """Read the config and every shard header; check them against each other (no weight is read).

    Raises :class:`~moescope.errors.ModelLoadError` with one sentence for a truncated shard, an
    index naming a missing file or tensor, or a tensor whose shape or dtype contradicts the config.
    """
    path = resolve_model(model)
    config = load_config(path)
    files = check_weights(path)  # safetensors' own header checks, and the index's files
    tensors, metadata = _read_headers(path, files)
    moe = adapt(_meta_model(config))
    return Checkpoint(path, moe, tensors, map_experts(moe, tensors), metadata)


def _meta_model(config: Any) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config)


def _read_headers(path: Path, files: list[Path]) -> tuple[list[StoredTensor], dict[str, str]]:
    tensors, shared = [], None
    for file in files:
        found, metadata = read_header(file)
        tensors.extend(found)
        items = {(k, v) for k, v in metadata.items() if isinstance(k, str) and isinstance(v, str)}
        shared = items if shared is None else shared & items
    _check_index(path, tensors)
    return tensors, {"format": "pt", **dict(sorted(shared or ()))}


def _check_index(path: Path, tensors: list[StoredTensor]) -> None:
    """Each tensor is stored once, where the index says it is."""
    where: dict[str, Path] = {}
    for tensor in tensors:
        if tensor.key in where:
            raise ModelLoadError(
                f"{tensor.key} is stored in both {where[tensor.key].name} and {tensor.file.name}; "
                "remove the stale shard."
            )
        where[tensor.key] = tensor.file
    index = path / INDEX_FILE
    if not index.is_file():
        return
    for key, name in json.loads(index.read_text())["weight_map"].items():
        if key not in where or where[key].name != name:
            raise ModelLoadError(
                f"{index} places {key} in {name}, which does not hold it; restore the index from the "
                "original checkpoint."
            )
