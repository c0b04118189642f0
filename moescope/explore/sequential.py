"""The calibration pass of a checkpoint larger than memory, one decoder layer at a time.

Every statistic the in-memory pass collects (:func:`~moescope.explore.routing.collect_routing`:
expert load, co-activation, routed-context sums, saliency, router entropy and logits) comes from
hooks on the real model's modules, so the layer-sequential pass runs the *same* model and the
same hooks and only changes where the weights live. The final norm is loaded as the in-memory
pass loads it; the decoder layers' weights stay on the meta device, and accelerate's big-model
hooks load each layer's weights when it starts and release them when it ends, the decoder layer
being accelerate's *preload* unit, so hooks that re-run an expert on the routed tokens
(saliency for models whose experts transformers does not fuse) see the weights of their own
layer. The input embeddings and the LM head, unless they share one weight, are read the same
way when they run: each is a vocabulary-sized matrix used once per batch (the pass keeps one
position's logits), which held for the whole pass would sit beside every layer (on the 4 GB
bench checkpoint the embeddings were an eighth of the pass's peak memory). The batch's hidden
states pass from layer to layer in memory, as in any forward.

Where the layers' weights come from is what bounds memory. accelerate takes them from a
``weights_map``; here that is :class:`~moescope.models.layer_weights.LayerWeights`, which reads
a layer's tensors from the checkpoint's own safetensors shards when the layer's preload asks
for them, converts them as ``from_pretrained`` does (per-expert tensors stacked into the fused
parameters, through transformers' own converters), and keeps nothing once handed over. Nothing
of a layer is read before it runs, nothing is written, and the shards are read with ``pread``
rather than mapped. ``from_pretrained``'s own disk offload (layers placed on ``"disk"``) would
read every tensor once while loading, re-save the converted ones to an offload folder, and map
each shard, whose pages count in the process's resident memory: on the 4 GB bench checkpoint a
peak RSS of 4.5 GB against the in-memory pass's 8.4 GB, where this design's is 1.0 GB.
The passes run *layer-major* (:mod:`moescope.models.row_chunks`): a forward takes as many rows
as their hidden states allow, and each decoder layer, once read, runs them in chunks of as many
rows as its activations may take, so the checkpoint is read once per forward and the transient
activations are one chunk's. Peak memory is one layer's weights, a forward's hidden states and
one chunk's activations (and the embeddings, where the LM head shares them), above the
interpreter's own; the chunks are sized within ``available`` (an export's ``--max-memory``)
where given, the forwards by what is free, a row's hidden states being small beside a layer.
:func:`check_memory` refuses a pass whose layer and hidden states would not fit, before its
first layer runs. Code that uses a layer's weights
outside its forward (the expert embeddings of :func:`~moescope.explore.embeddings.embed_experts`)
runs the same hooks around it (:func:`~moescope.models.resident.resident`), one layer in memory
at a time there too. Taylor importance (:func:`taylor_importance_sequential`) needs a backward,
for which autograd would keep every layer's weights: there each chunk runs again from its kept
input in the backward, the layer's weights read a second time for all its chunks
(:mod:`moescope.explore.taylor`).

Hand-rolled alternatives were weighed: a loop that runs ``layer(hidden)`` itself must rebuild
what the model's forward computes around its layers (rotary positions, masks, per-layer
attention types, shared-expert gates, Llama 4's chunked attention); llm-compressor's
sequential pipeline traces the model with torch.fx for the same reason, a dependency larger
than the problem here. accelerate is already a dependency of transformers' loading path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.memory import format_size
from moescope.errors import ModelLoadError, MoescopeError
from moescope.models.footprint import (  # the estimates the passes are sized by
    chunk_memory,
    largest_layer_bytes,
    layer_activation_bytes,
    row_state_bytes,
    rows_beside_layer,
)
from moescope.models.row_chunks import RowsFor, chunk_decoder_layers, row_width

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.explore.stats import RoutingStats
    from moescope.explore.taylor import TaylorImportance


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
    model: str | Path, *, dtype: Any = None, device: str = "cpu", available: int | None = None
) -> Iterator[PreTrainedModel]:
    """``model`` loaded so that each decoder layer's weights are in memory only while it runs.

    ``dtype`` is :func:`~moescope.models.loading.load_model`'s (float32 by default, ``"auto"``
    the checkpoint's). ``device`` is where it computes (``"cuda:0"``: the resident parts live
    there, and each layer is read from the shards onto it when it runs). ``available`` bounds
    a chunk's activations (bytes; default what is free when each is sized): each decoder layer
    runs a forward's rows in chunks of as many as fit beside it
    (:mod:`moescope.models.row_chunks`), so a forward holds every row's hidden states but one
    chunk's activations, and reads the checkpoint once. The final norm is
    loaded as ``load_model`` loads it; a decoder layer's weights (and the embeddings' and LM
    head's, unless tied) are read from the checkpoint's shards each time it runs. A quantized
    checkpoint is refused: its scales are applied by transformers' quantizers, which this
    reading bypasses.
    """
    from moescope.models.layer_weights import load_without_layers, meta_model, resolve_dtype
    from moescope.models.loading import check_weights, load_config, resolve_model

    path = resolve_model(model)
    config = load_config(path)
    if getattr(config, "quantization_config", None):
        raise ModelLoadError(
            f"{path} holds quantized weights, which the layer-sequential pass does not read; "
            "calibrate it in memory."
        )
    files = check_weights(path)
    loaded = meta_model(config, resolve_dtype(dtype, config, files))
    placement = _vocabulary_on_disk(loaded, layer_device_map(loaded))
    placement = {name: device if where == "cpu" else where for name, where in placement.items()}
    weights = load_without_layers(loaded, files, placement, name=str(path))
    _dispatch(loaded, placement, weights, device)
    _embeddings_read_per_forward(loaded)
    loaded._layer_weights = weights  # what checkpoint_reads counts
    loaded._pass_memory = available  # what a chunk of rows' activations are sized within
    chunk_decoder_layers(loaded, chunk_rows(loaded))
    yield loaded


def chunk_rows(model: PreTrainedModel) -> RowsFor:
    """Rows per chunk of a decoder layer's forward on ``model``: as many as
    :func:`~moescope.models.footprint.rows_beside_layer` holds of one row's activations, the
    larger of their estimate and what a row was measured to allocate (twice those when a
    backward follows: the layer run again, and its gradients). The largest layer's size is
    taken once: every layer of every forward asks."""
    layer = largest_layer_bytes(model)

    def rows_for(hidden: Any, backward: bool, measured: int | None) -> int:
        row = max(layer_activation_bytes(model.config, rows=1, seq_len=row_width(hidden)), measured or 0)
        return rows_beside_layer(
            model, row * (2 if backward else 1), available=chunk_memory(model), layer=layer
        )

    return rows_for


def checkpoint_reads(model: PreTrainedModel) -> int:
    """How many times a layer-sequential ``model`` has read its checkpoint so far: the reads of
    its most-read decoder layer (each forward reads every layer once; 0 for a model in memory)."""
    weights = getattr(model, "_layer_weights", None)
    return max(weights.reads.values(), default=0) if weights is not None else 0


def _vocabulary_on_disk(model: PreTrainedModel, placement: dict[str, str]) -> dict[str, str]:
    """``placement`` with the input embeddings and the LM head read when used, like a layer,
    unless they share one weight: each is a vocabulary-sized matrix used once per batch (the
    pass keeps the last position's logits only), and resident they would sit beside every layer."""
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    if getattr(head, "weight", None) is getattr(embeddings, "weight", None):
        return placement
    names = {id(module): name for name, module in model.named_modules()}
    wanted = (names.get(id(module)) for module in (embeddings, head) if module is not None)
    return placement | {name: "disk" for name in wanted if placement.get(name) == "cpu"}


def _dispatch(
    model: PreTrainedModel, placement: dict[str, str], weights: Mapping[str, Any], device: str = "cpu"
) -> None:
    """accelerate's hooks, with the decoder layer as the unit it loads from ``weights`` and
    releases at once, buffers included (a router's score-correction bias lives in its layer)."""
    from accelerate import dispatch_model

    from moescope.models.view import decoder_layers

    log = logging.getLogger("accelerate.big_modeling")
    level = log.level
    log.setLevel(logging.ERROR)  # its warning that offloaded parameters are on the meta device
    try:
        dispatch_model(
            model,
            placement,
            main_device=device,  # where a layer read from the shards runs
            state_dict=weights,  # accelerate reads an offloaded weight from here first,
            offload_index={},  # and from no file
            offload_buffers=True,
            skip_keys=getattr(model, "_skip_keys_device_placement", None),
            preload_module_classes=[type(decoder_layers(model)[0]).__name__],
        )
    finally:
        log.setLevel(level)


def _embeddings_read_per_forward(model: PreTrainedModel) -> None:
    """Input embeddings read when used stay in memory from the start of each forward to the end
    of their lookup: some forwards read the embeddings' device before the lookup (Llama 4 moves
    the token ids there), which accelerate's hook around the lookup alone leaves on the meta
    device. The same hook loads and releases them, once each per forward."""
    from accelerate.hooks import remove_hook_from_module

    embeddings = model.get_input_embeddings()
    hook = getattr(embeddings, "_hf_hook", None)
    if hook is None or not hook.offload:
        return
    remove_hook_from_module(embeddings)
    embeddings._read_when_used = hook  # what resident() runs to read them outside a forward

    def load(*_: Any) -> None:
        hook.pre_forward(embeddings)

    def release(module: Any, _: Any, output: Any) -> Any:
        return hook.post_forward(module, output)

    model.register_forward_pre_hook(load)
    embeddings.register_forward_hook(release)


def collect_routing_sequential(
    model: str | Path, data: Any, *, dtype: Any = None, available: int | None = None, **options: Any
) -> RoutingStats:
    """:func:`~moescope.explore.routing.collect_routing` on ``model`` run a decoder layer at a
    time (:func:`layer_sequential`): the same statistics, with one layer's weights in memory.

    ``available`` is the memory the pass may use (bytes; by default what the system has free),
    checked by :func:`check_memory` before the first layer runs.

    Example
    -------
    >>> import torch
    >>> ids = torch.randint(3, 44, (4, 32), generator=torch.Generator().manual_seed(0))  # 44: the vocabulary
    >>> stats = collect_routing_sequential("toy", ids, n_tokens=128, batch_size=4, seq_len=32, progress=False)
    >>> stats.n_tokens
    128
    """
    from moescope.explore.routing import collect_routing

    with layer_sequential(model, dtype=dtype, available=available) as loaded:
        shape = {name: options[name] for name in ("n_tokens", "seq_len") if name in options}
        return collect_routing(loaded, data, **_fitted(loaded, options, shape, available=available))


def taylor_importance_sequential(
    model: str | Path, data: Any, *, dtype: Any = "auto", available: int | None = None, **options: Any
) -> TaylorImportance:
    """:func:`~moescope.explore.taylor.taylor_importance` on ``model`` run a decoder layer at a
    time (:func:`layer_sequential`), its backward too: the same sums, with one layer's weights in
    memory.

    ``dtype`` is :func:`layer_sequential`'s (``"auto"``, the checkpoint's, as an export loads
    it). Each batch reads every layer twice (its forward, and once more for the backward's run
    of its chunks), so unless ``batch_size`` is given a batch takes as many rows as half the
    memory beside the largest layer holds (:func:`pass_batch_size`, every layer's input
    counted, and every position's logits where the LM head cannot run apart).
    ``available`` is as for :func:`collect_routing_sequential`.

    Example
    -------
    >>> import torch
    >>> ids = torch.randint(3, 44, (4, 32), generator=torch.Generator().manual_seed(0))  # 44: the vocabulary
    >>> taylor = taylor_importance_sequential("toy", ids, n_tokens=128, seq_len=32)
    >>> taylor.sequences, taylor.tokens  # every token after a row's first is scored
    (4, 124)
    """
    from moescope.explore.taylor import taylor_importance

    with layer_sequential(model, dtype=dtype, available=available) as loaded:
        shape = _pass_shape(data, options, backward=True)
        return taylor_importance(
            loaded, data, **_fitted(loaded, options, shape, available=available, backward=True)
        )


def fit_pass(
    model: PreTrainedModel,
    data: Any,
    options: dict[str, Any],
    *,
    backward: bool = False,
    available: int | None = None,
) -> dict[str, Any]:
    """``options`` of a calibration pass (``backward``: a Taylor pass) over ``data`` on a
    layer-sequential ``model``, with as many rows per batch as their hidden states allow beside
    a layer (each batch reads every layer from the shards), refused in one sentence where even
    one batch does not fit."""
    return _fitted(
        model, options, _pass_shape(data, options, backward), available=available, backward=backward
    )


def _fitted(
    model: PreTrainedModel,
    options: dict[str, Any],
    shape: dict[str, int],
    *,
    available: int | None,
    backward: bool = False,
) -> dict[str, Any]:
    """``options`` with ``batch_size`` (:func:`pass_batch_size` unless given), refused by
    :func:`check_memory` where one batch and the largest layer do not fit."""
    memory = {"available": available, "backward": backward}
    batch_size = options.get("batch_size") or pass_batch_size(model, **shape, **memory)
    check_memory(model, batch_size=batch_size, **shape, **memory)
    return {**options, "batch_size": batch_size}


def _pass_shape(data: Any, options: dict[str, Any], backward: bool) -> dict[str, int]:
    """``n_tokens`` and ``seq_len`` of a pass (``backward``: a Taylor pass): RL data's rows are
    padded to the longest at most (a Taylor pass reads every row once); other data, the
    options or their pass's defaults."""
    import inspect

    from moescope.explore.routing import collect_routing
    from moescope.explore.taylor import taylor_importance

    defaults = inspect.signature(taylor_importance if backward else collect_routing).parameters
    shape = {name: options.get(name, defaults[name].default) for name in ("n_tokens", "seq_len")}
    if callable(getattr(data, "pairs", None)):  # RL calibration (rl_data samples through this module)
        width = max(len(prompt) + len(completion) for prompt, completion in data.pairs())
        rows = len(data.pairs()) * width
        return {"n_tokens": rows if backward else min(rows, shape["n_tokens"]), "seq_len": width}
    tokenizer, seed = options.get("tokenizer"), options.get("seed", 0)
    return {**shape, "seq_len": data_width(data, tokenizer, **shape, seed=seed)}


def data_width(data: Any, tokenizer: Any, *, n_tokens: int, seq_len: int, seed: int = 0) -> int:
    """The longest row of the first ``n_tokens`` of calibration ``data`` cut at ``seq_len``
    (:func:`~moescope.explore.calibration.calibration_batches`): what a pass's rows are sized by,
    the task suite's rows being far shorter than ``seq_len``. Tokenizing is cheap beside a read
    of the checkpoint."""
    from moescope.explore.calibration import calibration_batches

    batches = calibration_batches(
        data, tokenizer, n_tokens=n_tokens, batch_size=n_tokens, seq_len=seq_len, seed=seed
    )
    return max(batch["input_ids"].shape[1] for batch in batches)


def pass_batch_size(
    model: PreTrainedModel,
    *,
    n_tokens: int | None = None,
    seq_len: int | None = None,
    available: int | None = None,
    backward: bool = False,
    logits: int | None = None,
) -> int:
    """Rows per forward of a layer-sequential pass: as many as half the memory left beside its
    largest layer (what is free, or ``available``) holds of their hidden states
    and kept logits (:func:`forward_row_bytes`, rows at ``seq_len``; ``backward``: a Taylor
    pass; ``logits``: the bytes a row's logits take where the pass keeps more than the last
    position's), at least one, at most one row per token.

    Every forward reads every layer from the shards again, and each layer runs the forward's
    rows in chunks its activations fit (:func:`chunk_rows`), so a forward is as large as the
    rows' hidden states allow: at the in-memory pass's 16 rows, a streaming export of toy-v3
    calibrated on the task suite's short rows read each layer 71 times for its statistics.
    """
    n_tokens = n_tokens if n_tokens is not None else _routing_default("n_tokens")
    seq_len = seq_len if seq_len is not None else _routing_default("seq_len")
    per_row = forward_row_bytes(model, seq_len=seq_len, backward=backward, logits=logits)
    return min(rows_beside_layer(model, per_row, available=available), n_tokens)


def forward_row_bytes(
    model: PreTrainedModel, *, seq_len: int, backward: bool = False, logits: int | None = None
) -> int:
    """What one row of ``seq_len`` positions holds through a whole forward of a layer-sequential
    ``model`` (:func:`~moescope.models.footprint.row_state_bytes`) and the logits the pass keeps:
    ``logits`` bytes where given, else the last position's, or, for a Taylor pass (``backward``)
    whose LM head cannot run in chunks (:func:`~moescope.models.lm_head.head_runs_apart`), every
    position's four times over."""
    from moescope.models.lm_head import head_runs_apart

    vocab = model.config.get_text_config().vocab_size
    if logits is None:
        logits = 16 * seq_len * vocab if backward and not head_runs_apart(model) else 4 * vocab
    return row_state_bytes(model.config, seq_len=seq_len, backward=backward) + logits


def forward_memory_per_row(model: PreTrainedModel, *, seq_len: int, logits: int = 0) -> int:
    """What a forward on ``model`` holds per row of ``seq_len`` positions: the row's hidden states
    where the decoder layers run rows in chunks (:func:`row_state_bytes`, a layer-sequential
    model), else one forward's activations; and the logits its caller keeps at ``logits``
    positions, three float32 copies (the logits, their float cast, the log-softmax)."""
    from moescope.models.footprint import activation_bytes
    from moescope.models.row_chunks import chunks_rows

    kept = 12 * logits * model.config.get_text_config().vocab_size
    if chunks_rows(model):
        return row_state_bytes(model.config, seq_len=seq_len) + kept
    return activation_bytes(model.config, n_tokens=seq_len, batch_size=1, seq_len=seq_len) + kept


def check_memory(
    model: PreTrainedModel,
    *,
    n_tokens: int | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    available: int | None = None,
    backward: bool = False,
) -> None:
    """Refuse, in one sentence and before any layer runs, a pass whose largest decoder layer and
    one batch's hidden states and kept logits (:func:`forward_row_bytes`) would not fit in
    ``available`` bytes (default: the memory free now where the model computes, its GPU's or the
    system's, the resident weights already loaded).

    ``n_tokens``, ``batch_size`` and ``seq_len`` are the pass's
    (:func:`~moescope.explore.routing.collect_routing`'s defaults where not given), ``backward``
    whether one follows. A layer's activations are not counted: each layer runs the batch's
    rows in chunks of as many as fit beside it, one row at least (:func:`chunk_rows`). A layer
    that does not fit is read into memory anyway, and the process is killed mid-pass; a batch
    is the one part the caller can shrink.
    """
    batch = {"n_tokens": n_tokens, "batch_size": batch_size, "seq_len": seq_len}
    batch = {name: value if value is not None else _routing_default(name) for name, value in batch.items()}
    rows = min(batch["batch_size"], -(-batch["n_tokens"] // batch["seq_len"]))
    layer = largest_layer_bytes(model)
    states = rows * forward_row_bytes(model, seq_len=batch["seq_len"], backward=backward)
    from moescope.models.device import free_memory

    free = free_memory(model) if available is None else available  # on a GPU, its own memory
    if layer + states <= free:
        return
    fix = (
        "calibrate with fewer tokens per batch (a smaller batch_size or n_tokens) or free memory"
        if layer < free
        else "this checkpoint needs a machine with more memory"
    )
    raise MoescopeError(
        f"one decoder layer ({format_size(layer)}) and the hidden states of one calibration batch (about "
        f"{format_size(states)}) need {format_size(layer + states)} but {format_size(free)} is free; {fix}."
    )


def _routing_default(name: str) -> int:
    import inspect

    from moescope.explore.routing import collect_routing

    return inspect.signature(collect_routing).parameters[name].default


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
