"""The calibration pass of a checkpoint larger than memory, one decoder layer at a time.

Every statistic the in-memory pass collects (:func:`~moescope.explore.routing.collect_routing`:
expert load, co-activation, routed-context sums, saliency, router entropy and logits) comes from
hooks on the real model's modules, so the layer-sequential pass runs the *same* model and the
same hooks and only changes where the weights live. That is what accelerate's big-model
dispatch does, through ``from_pretrained(device_map=..., offload_folder=...)``: each decoder
layer is placed on ``"disk"``, its weights read from the checkpoint's own safetensors shards
where transformers uses them as stored (and re-saved once to ``offload_folder`` where it
converts them, as it fuses per-expert tensors), and loaded for that layer's forward only. We
re-dispatch with the decoder layer as accelerate's *preload* unit, so a layer's weights are
loaded together when it starts and released when it ends: hooks that re-run an expert on the
routed tokens (saliency for models whose experts transformers does not fuse) see the weights
of their own layer. The batch's hidden states pass from layer to layer in memory, as in any
forward. Peak memory is one layer's weights, the embeddings and head, and one batch's
activations.

Hand-rolled alternatives were weighed: a loop that runs ``layer(hidden)`` itself must rebuild
what the model's forward computes around its layers (rotary positions, masks, per-layer
attention types, shared-expert gates, Llama 4's chunked attention); llm-compressor's
sequential pipeline traces the model with torch.fx for the same reason, a dependency larger
than the problem here. accelerate is already a dependency of transformers' loading path.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.errors import MoescopeError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.explore.stats import RoutingStats


def layer_device_map(model: PreTrainedModel) -> dict[str, str]:
    """Every decoder layer on ``"disk"``, every other top-level module resident (``"cpu"``).

    ``model`` may live on the meta device: only its module tree is read. A model whose
    decoder stack has weights outside any module (which accelerate cannot place) is refused.
    """
    from moescope.models.view import decoder_layers

    layers = decoder_layers(model)
    names = {id(module): name for name, module in model.named_modules()}
    stack = names[id(layers)]
    placement: dict[str, str] = {}
    path = ""
    for part in stack.split("."):
        parent = model.get_submodule(path)
        if any(True for _ in parent.named_parameters(recurse=False)):
            raise MoescopeError(
                f"{type(model).__name__} keeps weights directly on '{path or 'the model'}', outside any "
                "module, so its layers cannot be run one at a time; calibrate it in memory."
            )
        for child, _ in parent.named_children():
            if child != part:
                placement[f"{path}.{child}" if path else child] = "cpu"
        path = f"{path}.{part}" if path else part
    placement |= {f"{stack}.{i}": "disk" for i in range(len(layers))}
    return placement


@contextmanager
def layer_sequential(
    model: str | Path, *, dtype: Any = None, offload_folder: str | Path | None = None
) -> Iterator[PreTrainedModel]:
    """``model`` loaded so that each decoder layer's weights are in memory only while it runs.

    ``dtype`` is :func:`~moescope.models.loading.load_model`'s (float32 by default, ``"auto"``
    the checkpoint's). The weights transformers converts on loading (fused experts) are saved
    once in a temporary directory under ``offload_folder`` (default: the system's), removed on exit.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from moescope.models.loading import load_config, load_model, resolve_model

    path = resolve_model(model)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(load_config(path))
    placement = layer_device_map(skeleton)
    del skeleton
    with tempfile.TemporaryDirectory(prefix="moescope-offload-", dir=offload_folder) as folder:
        options = {"device_map": placement, "offload_folder": Path(folder)}
        with _quiet_dispatch():
            loaded, _ = load_model(path, dtype=dtype, with_tokenizer=False, **options)
            _preload_whole_layers(loaded, placement)
        yield loaded


@contextmanager
def _quiet_dispatch() -> Iterator[None]:
    """Without accelerate's warning that offloaded parameters are on the meta device: here that
    is the point."""
    import logging

    log = logging.getLogger("accelerate.big_modeling")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _preload_whole_layers(model: PreTrainedModel, placement: dict[str, str]) -> None:
    """Re-dispatch with the decoder layer as the unit accelerate loads and releases at once."""
    from accelerate import dispatch_model
    from accelerate.hooks import remove_hook_from_submodules

    from moescope.models.view import decoder_layers

    index = next(
        module._hf_hook.weights_map.dataset.index
        for module in model.modules()
        if getattr(getattr(module, "_hf_hook", None), "weights_map", None) is not None
    )
    remove_hook_from_submodules(model)
    layer_class = type(decoder_layers(model)[0]).__name__
    dispatch_model(
        model,
        placement,
        main_device="cpu",
        offload_index=index,
        skip_keys=getattr(model, "_skip_keys_device_placement", None),
        preload_module_classes=[layer_class],
    )


def collect_routing_sequential(
    model: str | Path, data: Any, *, dtype: Any = None, **options: Any
) -> RoutingStats:
    """:func:`~moescope.explore.routing.collect_routing` on ``model`` run a decoder layer at a
    time (:func:`layer_sequential`): the same statistics, with one layer's weights in memory.

    Example
    -------
    >>> import torch
    >>> ids = torch.randint(3, 44, (4, 32), generator=torch.Generator().manual_seed(0))  # 44: the vocabulary
    >>> stats = collect_routing_sequential("toy", ids, n_tokens=128, batch_size=4, seq_len=32, progress=False)
    >>> stats.n_tokens
    128
    """
    from moescope.explore.routing import collect_routing

    with layer_sequential(model, dtype=dtype) as loaded:
        return collect_routing(loaded, data, **options)


@contextmanager
def router_rows(model: PreTrainedModel) -> Iterator[dict[int, Any]]:
    """``{decoder layer: (E, H) float32 array}`` of every router, read while its layer runs.

    The paper's router view needs the rows; in a layer-sequential pass they are in memory only
    during their layer's forward, so a hook on each router copies them at the first pass.
    """
    from moescope.models.view import adapt

    rows: dict[int, Any] = {}

    def hook(layer: Any) -> Any:
        def read(*_: Any) -> None:
            if layer.index not in rows:
                rows[layer.index] = layer.router_weight.detach().float().cpu().numpy()

        return read

    handles = [layer.router.register_forward_hook(hook(layer)) for layer in adapt(model).layers]
    try:
        yield rows
    finally:
        for handle in handles:
            handle.remove()
