"""A checkpoint loaded without its decoder layers' weights, which are read from the shards when a
layer runs, converted as ``from_pretrained`` converts them.

:func:`load_without_layers` runs transformers' own loading steps (``_load_pretrained_model`` then
``_finalize_model_loading``, what ``from_pretrained`` runs) on a state dict whose tensors outside
the decoder layers are safetensors slices, read as transformers reads them, and whose tensors
inside the layers are empty tensors on the meta device. So transformers renames, converts,
checks and casts every tensor (its ``keep_in_fp32`` dtypes included) and ties and initialises
what the checkpoint lacks, while the layers' parameters stay on the meta device in the shape
and dtype transformers gave them; nothing of a layer is read. ``from_pretrained`` itself cannot
be used: it would dispatch the model again once loaded, onto the meta device.

:class:`LayerWeights` serves the layers' tensors to accelerate when asked (a ``weights_map``):
the first request of a layer reads and converts all of that layer's stored tensors through the
same renamings and converters (:mod:`moescope.models.conversion`), and each later request hands
one over and forgets it. Shards are read with ``pread`` (safetensors' ``backend="pread"``), not
mapped: pages of a mapped file count toward the process's resident memory while mapped, so
``from_pretrained``'s mapping of every shard held the whole checkpoint there.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import warnings
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moescope._util.memory import release_freed_memory
from moescope.errors import ModelLoadError
from moescope.models.conversion import conversions, converter_for, rename

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

# safetensors dtype code -> torch dtype name
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}
_FIX = "use the config.json that was saved with these weights"


@dataclass
class _Group:
    """The stored tensors that transformers turns into one model tensor (or a few, when it splits)."""

    converter: Any | None  # a WeightConverter; None for a tensor loaded as stored (perhaps renamed)
    sources: list[tuple[str, Path, str]] = field(default_factory=list)  # (key, shard, pattern)


def open_shard(file: Path) -> Any:
    """A safetensors handle that reads with ``pread`` into memory the tensor owns, so nothing of
    the file stays mapped; safetensors before 0.8 can only map, and unmaps when the handle closes."""
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt", backend="pread")
    except TypeError:
        return safe_open(str(file), framework="pt")


def meta_model(config: PretrainedConfig, dtype: torch.dtype) -> PreTrainedModel:
    """The model built on the meta device in ``dtype`` (no memory, no weights)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def resolve_dtype(dtype: Any, config: PretrainedConfig, files: list[Path]) -> torch.dtype:
    """:func:`~moescope.models.loading.load_model`'s dtype: float32 by default; ``"auto"`` the
    config's, else the checkpoint's first floating-point tensor's, as ``from_pretrained`` reads it."""
    if dtype is None:
        return torch.float32
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or _stored_dtype(files)
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def _stored_dtype(files: list[Path]) -> torch.dtype:
    for file in files:
        with open_shard(file) as shard:
            for key in shard.keys():  # noqa: SIM118 (a safetensors handle is not iterable)
                dtype = getattr(torch, SAFETENSORS_DTYPES.get(shard.get_slice(key).get_dtype(), "int8"))
                if dtype.is_floating_point:
                    return dtype
    return torch.float32


def load_without_layers(
    model: PreTrainedModel, files: list[Path], placement: dict[str, str], *, name: str
) -> LayerWeights:
    """Load into ``model`` (built by :func:`meta_model`) every weight outside the modules that
    ``placement`` puts on ``"disk"``; those stay on the meta device, served by the returned map.

    ``name`` is what ``from_pretrained`` would record as the model's path. A weight the
    checkpoint lacks inside those modules, or one whose shape contradicts the config, is refused
    in one sentence.
    """
    layers = tuple(f"{module}." for module, where in placement.items() if where == "disk")
    with contextlib.ExitStack() as stack:
        shards = {file: stack.enter_context(open_shard(file)) for file in files}
        stored = {key: file for file, shard in shards.items() for key in shard.keys()}  # noqa: SIM118
        groups = _plan(model, stored, layers)
        inside = {key for layer in groups.values() for group in layer.values() for key, _, _ in group.sources}
        state = {
            key: _placeholder(shards[file], key) if key in inside else shards[file].get_slice(key)
            for key, file in stored.items()
        }
        _load(model, state, {m: "meta" if where == "disk" else where for m, where in placement.items()}, name)
    return LayerWeights(model, groups, layers)


def _plan(
    model: PreTrainedModel, stored: dict[str, Path], layers: tuple[str, ...]
) -> dict[str, dict[str, _Group]]:
    """Layer prefix → {model tensor: its stored tensors}, grouped as transformers groups them
    (``convert_and_load_state_dict_in_model``: keys in natural order, one converter per target)."""
    from transformers.core_model_loading import dot_natural_key

    renamings, converters = conversions(model)
    state = model.state_dict()
    groups: dict[str, dict[str, _Group]] = {layer: {} for layer in layers}
    for key in sorted(stored, key=dot_natural_key):
        target, pattern = rename(key, renamings, converters, model, state)
        layer = next((layer for layer in layers if target.startswith(layer)), None)
        if layer is None or target not in state:
            continue
        converter = None if pattern is None else converter_for(converters, pattern)
        group = groups[layer].setdefault(target, _Group(converter))
        group.sources.append((key, stored[key], pattern or key))
    return groups


def _placeholder(shard: Any, key: str) -> torch.Tensor:
    """An empty tensor on the meta device with the stored tensor's shape and dtype."""
    stored = shard.get_slice(key)
    dtype = SAFETENSORS_DTYPES.get(stored.get_dtype())
    if dtype is None:
        raise ModelLoadError(f"{key} is stored as {stored.get_dtype()}, which moescope cannot read.")
    return torch.empty(stored.get_shape(), dtype=getattr(torch, dtype), device="meta")


def _load(model: PreTrainedModel, state: dict[str, Any], device_map: dict[str, str], name: str) -> None:
    """transformers' loading steps of ``from_pretrained``, short of its final dispatch."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.modeling_utils import LoadStateDictConfig

    dtype = model.dtype
    options = LoadStateDictConfig(
        pretrained_model_name_or_path=name,
        device_map=device_map,
        dtype=dtype,
        dtype_plan=model._get_dtype_plan(dtype),
        weight_mapping=get_model_conversion_mapping(model),
    )
    model.config.name_or_path = name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        info, _ = type(model)._load_pretrained_model(model, state, None, options)
        _check_loaded(model, info, [module for module, where in device_map.items() if where == "meta"])
        # computed buffers (rotary tables), the layers' too, are made and filled on the CPU
        type(model)._finalize_model_loading(model, replace(options, device_map={"": "cpu"}), info)
    model.eval()


def _check_loaded(model: PreTrainedModel, info: Any, layers: list[str]) -> None:
    """No stored shape contradicts the config, and every tensor of the layers is stored (there is
    nothing else to read it from)."""
    if info.mismatched_keys:
        key, stored, expected = min(info.mismatched_keys)
        raise ModelLoadError(
            f"{key} has shape {list(stored)} in the checkpoint but config.json implies "
            f"{list(expected)}; {_FIX}."
        )
    tied = set(getattr(model, "all_tied_weights_keys", {}))
    gaps = sorted(key for key in info.missing_keys - tied if key.startswith(tuple(f"{m}." for m in layers)))
    if gaps:
        raise ModelLoadError(f"the checkpoint has no weights for {gaps[0]}; re-copy its shards or {_FIX}.")


TRIM_AFTER = 64 << 20
"""Bytes of layers read between two trims of the C heap: what a layer-sequential pass's resident
set may grow by before the freed layers' pages go back (blocks above glibc's 32 MiB mmap
threshold go back when freed anyway)."""


class LayerWeights(Mapping[str, torch.Tensor]):
    """``{model tensor name: tensor}`` of the modules left on the meta device (the decoder layers,
    a layer meaning any such module), read from the shards when asked.

    accelerate asks for all of a layer's tensors when the layer starts (its preload): the first
    request reads and converts the whole layer, each one hands its tensor over and forgets it,
    so between layers this map holds nothing and a layer's weights are freed when accelerate
    puts the layer back on the meta device.
    """

    def __init__(self, model: PreTrainedModel, groups: dict[str, dict[str, _Group]], layers: tuple[str, ...]):
        self._model, self._groups, self.layers = model, groups, layers
        state = model.state_dict()  # the layers' tensors on the meta device, as transformers shaped them
        self._meta = {name: tensor for name, tensor in state.items() if name.startswith(layers)}
        self._layer = {name: next(layer for layer in layers if name.startswith(layer)) for name in self._meta}
        self._ready: dict[str, torch.Tensor] = {}
        self.reads: collections.Counter[str] = collections.Counter()  # layer prefix → times read
        self._untrimmed = 0  # bytes of layers read since the C heap was last trimmed

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._ready:
            if name not in self._meta:
                raise KeyError(name)
            self._ready = self.read(self._layer[name])
        return self._ready.pop(name)

    def __contains__(self, name: object) -> bool:
        return name in self._meta

    def __iter__(self) -> Iterator[str]:
        return iter(self._meta)

    def __len__(self) -> int:
        return len(self._meta)

    def read(self, layer: str, leave_out: Container[str] = ()) -> dict[str, torch.Tensor]:
        """Every tensor of one layer (its prefix, e.g. ``"model.layers.3."``), as the model holds it,
        but those named in ``leave_out`` (full names): a check of the layer's backbone reads no
        expert tensor. Counted as a read of the layer either way."""
        self._trim()
        self.reads[layer] += 1
        groups = {target: group for target, group in self._groups[layer].items() if target not in leave_out}
        files = {file for group in groups.values() for _, file, _ in group.sources}
        with contextlib.ExitStack() as stack:
            shards = {file: stack.enter_context(open_shard(file)) for file in files}
            tensors: dict[str, torch.Tensor] = {}
            for target, group in groups.items():
                tensors |= self._convert(target, group, shards)
        self._untrimmed += sum(t.numel() * t.element_size() for t in tensors.values())
        return tensors

    def _trim(self) -> None:
        """Hand the layers freed so far back to the system once they add up to :data:`TRIM_AFTER`:
        trimmed at every read, toy-v3's 1.8 MB layers, read thousands of times by a
        layer-sequential export, cost it 15.5 million page faults (62 s of system time against 27 s
        untrimmed, of 430 s), each trim handing back pages the next layer faulted in again. A
        layer larger than it (any large model's) is trimmed after as before."""
        if self._untrimmed >= TRIM_AFTER:
            release_freed_memory()  # the previous layers', freed when accelerate released them
            self._untrimmed = 0

    def _convert(self, target: str, group: _Group, shards: dict[Path, Any]) -> dict[str, torch.Tensor]:
        """One group's tensors, cast to the dtype transformers chose for ``target`` before converting."""
        dtype = self._meta[target].dtype
        if group.converter is None:
            key, file, _ = group.sources[0]
            return {target: shards[file].get_tensor(key).to(dtype)}
        if _stacks_experts(group.converter):
            return {target: self._stack(target, group, shards)}
        converter = copy.deepcopy(group.converter)
        for key, file, pattern in group.sources:
            converter.add_tensor(target, key, pattern, functools.partial(_read, shards[file], key, dtype))
        converted = converter.convert(target, model=self._model, config=self._model.config)
        return {name: value[0] if isinstance(value, list) else value for name, value in converted.items()}

    def _stack(self, target: str, group: _Group, shards: dict[Path, Any]) -> torch.Tensor:
        """``MergeModulelist(0)`` then ``Concatenate(1)``, written in place: expert ``i``'s rows of
        each source pattern, in pattern order, fill ``out[i]``. transformers stacks each part then
        concatenates the stacks, holding a fused tensor twice over beside its parts; this holds it once."""
        expected = self._meta[target]
        out = torch.empty(expected.shape, dtype=expected.dtype)
        row = 0
        for pattern in group.converter.source_patterns:
            experts = [(key, file) for key, file, source in group.sources if source == pattern]
            if len(experts) != out.shape[0]:
                raise ModelLoadError(
                    f"{target} needs {out.shape[0]} experts' {pattern} and the checkpoint holds "
                    f"{len(experts)}; re-copy its shards or {_FIX}."
                )
            for expert, (key, file) in enumerate(experts):
                tensor = shards[file].get_tensor(key)
                out[expert, row : row + tensor.shape[0]].copy_(tensor)
            row += tensor.shape[0]
        return out


def _read(shard: Any, key: str, dtype: torch.dtype) -> torch.Tensor:
    return shard.get_tensor(key).to(dtype)


def _stacks_experts(converter: Any) -> bool:
    """transformers' per-expert layout: one tensor per expert stacked, parts joined on rows."""
    ops = [(type(op).__name__, getattr(op, "dim", None)) for op in converter.operations]
    return ops in ([("MergeModulelist", 0)], [("MergeModulelist", 0), ("Concatenate", 1)])
