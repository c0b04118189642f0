"""One decoder layer's weights in memory for code that runs outside its forward pass.

Under accelerate's big-model dispatch (the layer-sequential pass of
:mod:`moescope.explore.sequential`) a decoder layer's weights are loaded by the hook accelerate
attaches to the layer, just before its forward, and dropped right after. Code that reads a
layer's weights or calls its experts itself — the weight, router and outputs views of
:func:`~moescope.explore.embeddings.embed_experts` — would find them on the meta device.
:func:`resident` runs that same hook around such code, so there too one layer is in memory at a
time, read the way its forward reads it. On a model loaded whole it does nothing.
Under the same dispatch a model's first parameter may be on the meta device (its embeddings,
read when used): :func:`execution_device` says where its inputs belong, and
:func:`read_when_used` whether a module's weights are loaded only while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn


def execution_device(model: nn.Module) -> torch.device:
    """Where ``model`` computes: the device of its first weight that is not on the meta device.

    A layer-sequential model keeps every weight that is read when used (its embeddings
    included) on the meta device, so its first parameter does not say where inputs belong.

    Example
    -------
    >>> execution_device(nn.Linear(2, 2))
    device(type='cpu')
    """
    devices = (p.device for p in model.parameters() if p.device.type != "meta")
    return next(devices, torch.device("cpu"))


def read_when_used(module: nn.Module) -> bool:
    """Whether accelerate loads ``module``'s weights when it runs and releases them after (a
    decoder layer of a layer-sequential model), rather than keeping them in memory.

    Example
    -------
    >>> read_when_used(nn.Linear(2, 2))
    False
    """
    hook = getattr(module, "_hf_hook", None)
    return any(getattr(each, "offload", False) for each in getattr(hook, "hooks", (hook,)))


@contextmanager
def resident(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` with its weights on its execution device for the ``with`` block.

    The hooks are the module's own (a decoder layer accelerate loads as a unit) or, where it
    has none, its submodules' (a layer of another class than the first, loaded part by part).

    Example
    -------
    >>> layer = nn.Linear(2, 2)
    >>> with resident(layer) as same:  # not dispatched by accelerate: nothing to load
    ...     same is layer
    True
    """
    hooks = [(m, _loading_hook(m)) for m in module.modules()]
    with ExitStack() as stack:
        for part, hook in hooks:
            if hook is not None:
                hook.pre_forward(part)
                stack.callback(hook.post_forward, part, None)
        yield module


def _loading_hook(module: nn.Module) -> object | None:
    """accelerate's hook on ``module``, or the one the layer-sequential pass moved off input
    embeddings it reads when used (:mod:`moescope.explore.sequential`)."""
    return getattr(module, "_hf_hook", None) or getattr(module, "_read_when_used", None)


def read_per_forward(model: nn.Module) -> bool:
    """Whether ``model``'s decoder layers are read from disk each time they run (the
    layer-sequential pass): then every forward costs a read of the checkpoint, and callers
    batch as many rows into one as memory holds.

    Example
    -------
    >>> read_per_forward(nn.Linear(2, 2))
    False
    """
    return any(read_when_used(module) for module in model.modules())
