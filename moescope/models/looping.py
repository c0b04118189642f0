"""Looped MoE: a decoder stack applied ``loop_times`` times with shared weights.

The deployment guide's Loop-MoE trades extra compute for depth by running the same layers
again. On a stock transformers model the loop is built in place: the decoder layer list becomes
``layers * loop_times``, where each repeat is a shallow copy sharing every parameter with the
original but with its own attention ``layer_idx`` (so the KV cache keeps one slot per applied
layer), and ``num_hidden_layers`` / ``layer_types`` grow to match. The loop count lives in the
config as ``loop_times``, which ``save_pretrained`` keeps, so an exported proxy keeps it too.
"""

from __future__ import annotations

import copy

from torch import nn

from moescope.errors import MoescopeError
from moescope.models.view import decoder_layers

CONFIG_KEY = "loop_times"


def loop_times_of(config) -> int:
    """The loop count a config declares (1 when it declares none)."""
    value = getattr(config, CONFIG_KEY, None) or 1
    if not isinstance(value, int) or value < 1:
        raise MoescopeError(f"config {CONFIG_KEY}={value!r} is not a positive integer; fix config.json.")
    return value


def apply_loop(model: nn.Module, loop_times: int) -> nn.Module:
    """Make ``model`` apply its decoder stack ``loop_times`` times (in place; returns it)."""
    if loop_times < 1:
        raise MoescopeError(f"loop_times must be at least 1, not {loop_times}.")
    if getattr(model, "_moescope_looped", 1) != 1:
        raise MoescopeError("This model is already looped; load it again to loop it differently.")
    layers = decoder_layers(model)
    base = list(layers)
    n = len(base)
    looped = list(base)
    for repeat in range(1, loop_times):
        for i, layer in enumerate(base):
            looped.append(_shared_copy(layer, repeat * n + i))
    layers._modules.clear()
    for i, layer in enumerate(looped):
        layers.add_module(str(i), layer)
    config = model.config
    text = getattr(config, "text_config", None) or config
    for cfg in {id(config): config, id(text): text}.values():
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = list(cfg.layer_types) * loop_times
        if hasattr(cfg, "num_hidden_layers"):
            cfg.num_hidden_layers = n * loop_times
    model._moescope_looped = loop_times
    return model


def _shared_copy(layer: nn.Module, layer_idx: int) -> nn.Module:
    """A copy of ``layer`` sharing its parameters, with attention ``layer_idx`` set."""
    twin = copy.copy(layer)
    twin._modules = dict(layer._modules)
    for name, child in layer._modules.items():
        if child is not None and hasattr(child, "layer_idx"):
            attn = copy.copy(child)
            attn.layer_idx = layer_idx
            twin._modules[name] = attn
    if hasattr(twin, "layer_idx"):
        twin.layer_idx = layer_idx
    return twin
