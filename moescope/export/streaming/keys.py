"""Which checkpoint tensors hold routed experts, in either layout, told from their keys alone.

A checkpoint stores the routed experts of a layer fused, as models hold them in memory
(``mlp.experts.gate_up_proj [E, 2I, H]``), or one key per expert and projection, as most Hub
checkpoints do (``mlp.experts.7.gate_proj.weight``, Mixtral's
``block_sparse_moe.experts.7.w1.weight``, ...). Rather than keep a second table of names, every key
goes through the conversion ``from_pretrained`` itself applies (:mod:`moescope.models.conversion`:
transformers' renamings and its ``MergeModulelist`` / ``Concatenate`` converters, and ``Interleave``
of a fused tensor's gate and up rows, Inkling 2's original layout) onto a parameter of the model
built on the meta device, and the architecture table (:func:`~moescope.models.view.adapt`) says
which parameters hold one slice per expert.
So the streaming export reads the layouts transformers loads and slices exactly the tensors the
in-memory export slices; shapes and dtypes are checked against the config on the way. A converter
it cannot read is refused in one sentence that names the in-memory export instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from moescope.errors import ModelLoadError, UnsupportedArchitectureError
from moescope.export.streaming.shards import StoredTensor
from moescope.export.surgery import expert_state_keys
from moescope.models.conversion import conversions, converter_for, rename
from moescope.models.view import MoEModel, expert_axis

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_EXPERT_ID = re.compile(r"\.experts\.(\d+)\.")
_LAYER_ID = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_FIX = "use the config.json that was saved with these weights"


@dataclass(frozen=True)
class ExpertKey:
    """How one checkpoint tensor relates to the routed experts of its MoE layer.

    Fused tensors have an ``axis`` with one slice per expert; per-expert keys name their
    ``expert`` and, as ``template``, the key with ``{}`` in place of its id. ``target`` is the
    model parameter the tensor loads into (``None`` for per-expert data no parameter takes,
    such as quantization scales) and ``param`` its name on the experts module (``None`` for
    router rows and biases); ``part`` is its place among the ``parts`` keys concatenated into it.
    ``interleaved`` marks a fused tensor whose checkpoint interleaves each expert's gate and up
    rows (Inkling 2's ``w13_weight``; loading reorders them gate-first): its expert slices are
    copied as they are, and the weight view reads the two halves from alternate rows.
    """

    layer: int
    target: str | None
    param: str | None = None
    axis: int | None = None
    expert: int | None = None
    part: int = 0
    parts: int = 1
    template: str = ""
    interleaved: bool = False


def map_experts(moe: MoEModel, stored: list[StoredTensor]) -> dict[str, ExpertKey]:
    """Checkpoint key → :class:`ExpertKey` for every tensor tied to routed experts; the others
    are copied unchanged. Raises a one-sentence :class:`ModelLoadError` for a shape or dtype the
    config contradicts, or a layer whose experts are incomplete."""
    model = moe.model
    renamings, converters = conversions(model)
    state = model.state_dict()
    targets = expert_state_keys(moe)
    names = {
        id(p): name for layer in moe.layers for name, p in layer.expert_module.named_parameters(recurse=False)
    }
    dtype, moe_layers = _declared_dtype(model.config), set(moe.moe_indices)
    found: dict[str, ExpertKey] = {}
    for tensor in stored:
        target, pattern = rename(tensor.key, renamings, converters, model, state)
        if target not in targets:
            sidecar = _sidecar(tensor.key, target, moe_layers)
            if sidecar is not None:
                found[tensor.key] = sidecar
            elif target in state and pattern is None:
                _check_shape(tensor, tuple(state[target].shape))
            elif target in state:
                _check_joined(tensor, tuple(state[target].shape), converter_for(converters, pattern))
            continue
        layer, param = targets[target]
        name = names.get(id(param))
        if dtype is not None and name is not None and tensor.torch_dtype != dtype:
            raise ModelLoadError(
                f"{tensor.key} is stored as {tensor.torch_dtype} but config.json says the weights are "
                f"{dtype}; {_FIX}."
            )
        converter = None if pattern is None else converter_for(converters, pattern)
        if converter is None or _interleaves_rows(converter):  # stored fused, in the parameter's shape
            _check_shape(tensor, tuple(param.shape))
            axis = expert_axis(param, moe.num_experts)
            found[tensor.key] = ExpertKey(layer, target, name, axis=axis, interleaved=converter is not None)
        else:
            found[tensor.key] = _per_expert(tensor, ExpertKey(layer, target, name), param, converter, pattern)
    _check_complete(found, targets, moe.num_experts)
    _check_alike(found, {tensor.key: tensor for tensor in stored})
    return found


def _interleaves_rows(converter: Any) -> bool:
    """transformers' ``Interleave`` of the rows of each expert (the axis after the experts') alone."""
    ops = [
        (type(op).__name__, getattr(op, "dim", None), getattr(op, "inverse", None))
        for op in converter.operations
    ]
    return ops == [("Interleave", 1, False)]


def _per_expert(
    tensor: StoredTensor, entry: ExpertKey, param: torch.Tensor, converter: Any, pattern: str
) -> ExpertKey:
    """A per-expert key: stacked (``MergeModulelist``), possibly concatenated with its siblings."""
    ops = [(type(op).__name__, getattr(op, "dim", None)) for op in converter.operations]
    parts = len(converter.source_patterns)
    if ops not in ([("MergeModulelist", 0)], [("MergeModulelist", 0), ("Concatenate", 1)]):
        raise UnsupportedArchitectureError(
            f"{tensor.key} loads through {ops}, which streaming export does not read; export in "
            "memory (--no-streaming, or streaming=False in Python)."
        )
    expected = list(param.shape[1:])
    expected[0] //= parts  # Concatenate(dim=1) on the stacked tensor joins rows of each expert
    _check_shape(tensor, tuple(expected))
    expert, template = _expert_id(tensor.key)
    part = converter.source_patterns.index(pattern)
    return replace(entry, expert=expert, part=part, parts=parts, template=template)


def _sidecar(key: str, target: str, moe_layers: set[int]) -> ExpertKey | None:
    """Per-expert data no parameter takes (e.g. FP8 ``weight_scale_inv``): kept with its expert."""
    layer = _LAYER_ID.search(target) or _LAYER_ID.search(key)
    if layer is None or int(layer.group(1)) not in moe_layers or not _EXPERT_ID.search(key):
        return None
    expert, template = _expert_id(key)
    return ExpertKey(int(layer.group(1)), None, expert=expert, template=template)


def _expert_id(key: str) -> tuple[int, str]:
    """The expert id in a per-expert key, and the key with ``{}`` in its place."""
    matches = list(_EXPERT_ID.finditer(key))
    if len(matches) != 1:
        raise UnsupportedArchitectureError(
            f"cannot tell which expert {key} belongs to; export in memory (--no-streaming, or "
            "streaming=False in Python)."
        )
    start, end = matches[0].span(1)
    return int(matches[0].group(1)), key[:start] + "{}" + key[end:]


def _check_shape(tensor: StoredTensor, expected: tuple[int, ...]) -> None:
    if tensor.shape != expected:
        raise ModelLoadError(
            f"{tensor.key} has shape {list(tensor.shape)} but config.json implies {list(expected)}; {_FIX}."
        )


def _check_joined(tensor: StoredTensor, target: tuple[int, ...], converter: Any) -> None:
    """A tensor that loading joins with others or splits (Sarvam's fused ``query_key_value``,
    Kimi-Linear's per-projection convolutions): every axis but the joined one must match."""
    axes = {getattr(op, "dim", None) for op in converter.operations}
    if len(axes) != 1 or None in axes:
        return  # an operation without one axis: from_pretrained checks what it builds
    axis = axes.pop() % max(len(target), 1)
    if len(tensor.shape) != len(target) or any(
        n != m for i, (n, m) in enumerate(zip(tensor.shape, target, strict=True)) if i != axis
    ):
        expected = ["*" if i == axis else n for i, n in enumerate(target)]
        raise ModelLoadError(
            f"{tensor.key} has shape {list(tensor.shape)} but config.json implies {expected}; {_FIX}."
        )


def _declared_dtype(config: PretrainedConfig) -> torch.dtype | None:
    """The dtype config.json declares for the weights; ``None`` when unsaid or quantized."""
    if getattr(config, "quantization_config", None):
        return None
    dtype = getattr(config, "dtype", None)
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    return dtype if isinstance(dtype, torch.dtype) else None


def _check_complete(found: dict[str, ExpertKey], targets: dict[str, Any], num_experts: int) -> None:
    """Every expert tensor is stored once: fused, or one key per expert and part."""
    groups: dict[str, list[ExpertKey]] = defaultdict(list)
    for entry in found.values():
        groups[entry.target or f"{entry.layer}:{entry.template}"].append(entry)
    for target in targets:
        if target not in groups:
            raise ModelLoadError(f"the checkpoint has no weights for {target}; re-copy its shards or {_FIX}.")
    for target, entries in groups.items():
        if entries[0].expert is not None:
            _check_experts(entries, num_experts)
        elif len(entries) > 1:
            raise ModelLoadError(f"{target} is stored more than once; re-copy the checkpoint.")


def _check_experts(entries: list[ExpertKey], num_experts: int) -> None:
    """Per-expert keys: every expert ``0..E-1`` and every part, once, and no other expert."""
    first = entries[0]
    extra = next((e for e in entries if e.expert >= num_experts), None)
    if extra is not None:
        raise ModelLoadError(
            f"{extra.template.format(extra.expert)} names expert {extra.expert} but config.json says "
            f"{num_experts} experts per layer; {_FIX}."
        )
    have = {(e.expert, e.part) for e in entries}
    if any(e.axis is not None for e in entries) or len(have) < len(entries):
        raise ModelLoadError(f"{first.target} is stored more than once; re-copy the checkpoint.")
    for part in range(first.parts):
        missing = [expert for expert in range(num_experts) if (expert, part) not in have]
        if missing:
            named = next((e for e in entries if e.part == part), None)
            what = named.template.format(missing[0]) if named else f"part {part + 1} of {first.target}"
            raise ModelLoadError(
                f"{what} is missing from the checkpoint, and layer {first.layer} needs all {num_experts} "
                f"experts; re-copy its shards or {_FIX}."
            )


def _check_alike(found: dict[str, ExpertKey], stored: dict[str, StoredTensor]) -> None:
    """The same key of every expert has one dtype and shape, so any expert can fill any slot."""
    first: dict[tuple[int, str], StoredTensor] = {}
    for key, entry in found.items():
        if entry.expert is None:
            continue
        tensor = stored[key]
        seen = first.setdefault((entry.layer, entry.template), tensor)
        if (tensor.dtype, tensor.shape) != (seen.dtype, seen.shape):
            raise ModelLoadError(
                f"{key} is {tensor.dtype} {list(tensor.shape)} but {seen.key} is {seen.dtype} "
                f"{list(seen.shape)}; the experts of a layer must be stored alike, re-copy the checkpoint."
            )
