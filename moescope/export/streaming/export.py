"""Streaming proxy export: cut a checkpoint shard by shard, without ever loading the model.

The in-memory export (:func:`moescope.export.pipeline.export_proxy`) loads the model, so its peak memory
is the model plus the proxy. This one reads the safetensors shards (through
``model.safetensors.index.json`` when sharded) a byte range at a time and writes the proxy's
shards as it goes:

* per-expert keys of dropped experts are skipped and the kept ones renumbered ``0..K-1`` in
  numeric order, the order transformers stacks them in, so the checkpoint loads to the same
  model as the in-memory proxy;
* fused expert tensors, router rows, router biases and correction biases are sliced on their
  expert axis (tensors are told apart by :mod:`moescope.export.streaming.keys`);
* every other tensor is copied byte for byte, in the source's order, layout and dtype (a
  multimodal checkpoint's vision tower included; its ``text_config`` gets the expert count).

Memory. With the selection known before the pass (``selection=``, or ``method="random"``) the
pass holds one copy buffer. With ``method="cluster"`` it holds one MoE layer's expert tensors at
a time: their weight-view sketches (the vectors ``embed_experts(model, "weights")`` gives) are
clustered as soon as the layer is mapped, and the kept experts are written from the mapping. So
the peak is one layer's experts plus a fixed overhead, whatever the size of the model.
``frequency``, ``reap`` and ``paper`` choose by a calibration pass through the model
(``paper``'s co-activation and routed-context views are its running sums): streaming runs it a
decoder layer at a time (:mod:`moescope.explore.sequential`) before the cutting pass, so it
holds one layer's weights, the embeddings and one batch's activations.

Examples
--------
>>> import tempfile
>>> from moescope.models.zoo import tiny
>>> with tempfile.TemporaryDirectory() as tmp:
...     tiny("mixtral").save_pretrained(f"{tmp}/model")
...     export_streaming(f"{tmp}/model", f"{tmp}/proxy", keep="1/2", progress=False).selection.keep
4
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from moescope._util.io import check_output_dir, readable, replace_dir
from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import ExpertEmbeddings, _Projector, model_facts
from moescope.explore.methods import METHODS
from moescope.explore.methods import method as method_named
from moescope.explore.selection import STREAMING_METHOD, Selection
from moescope.export.config import ExportConfig, ExportInputs, configure, resolve_method
from moescope.export.manifest import copy_side_files, make_manifest, write_manifest
from moescope.export.result import ExportResult
from moescope.export.streaming.calibrated import calibrated_selection
from moescope.export.streaming.checkpoint import Checkpoint, open_checkpoint
from moescope.export.streaming.passes import EMBED_DIM, Pass, plan_outputs
from moescope.export.streaming.weight_view import LayerRead, MemoryBudget, layer_vectors
from moescope.export.surgery import given_selection, keep_of, proxy_config

DEFAULT_SHARD_SIZE = "5GB"


# --- the weight view ---------------------------------------------------------------------------


def embed_checkpoint(model: str | Path, *, seed: int = 0, progress: bool = True) -> ExpertEmbeddings:
    """Weight-view expert embeddings read from the shards, one layer in memory at a time.

    The vectors equal ``embed_experts(loaded_model, "weights", seed=seed)``, for either
    checkpoint layout, without loading the model.
    """
    checkpoint = open_checkpoint(model)
    projector = _Projector(seed, EMBED_DIM)
    budget, rows = MemoryBudget(checkpoint.layer_bytes), []
    for layer in _progress(checkpoint.moe.moe_indices, progress, "weight embeddings", unit="layer"):
        read = LayerRead(checkpoint, layer, budget)
        try:
            rows.append(layer_vectors(checkpoint, layer, read, projector))
        finally:
            read.release()
    facts = model_facts(checkpoint.moe)
    return ExpertEmbeddings(view="weights", seed=seed, vectors=np.stack(rows), **facts)


# --- the export ----------------------------------------------------------------------------------


def export_streaming(
    model: str | Path,
    out: str | Path,
    config: ExportConfig | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    max_shard_size: int | str = DEFAULT_SHARD_SIZE,
    **options: Any,
) -> ExportResult:
    """Write a proxy of ``model`` to ``out`` from its safetensors shards, in one read.

    Parameters are those of :func:`moescope.export.pipeline.export_proxy` (the config's ``keep``,
    ``selection``, ``method``, ``seed`` and ``allow_top_k`` apply, or its fields as keywords),
    plus ``max_shard_size`` (bytes, or ``"5GB"``): the largest output shard.
    ``method="cluster"`` clusters the weight view; ``frequency``, ``reap`` and ``paper`` calibrate
    a decoder layer at a time first.
    The result's ``embeddings`` are the clustered vectors (``None`` when the selection was given
    or random).
    """
    config, inputs = configure(config, options)
    config, inputs = resolve_method(config, inputs, default=STREAMING_METHOD)
    check_output_dir(out, overwrite=overwrite)  # fail in seconds, before reading anything
    checkpoint = open_checkpoint(model)
    keep_n, chosen, calibration = _selection_before_pass(checkpoint, config, inputs, progress)
    run = Pass(checkpoint, keep_n, chosen, config.seed, config.allow_top_k)
    shard_bytes = _shard_bytes(max_shard_size)
    done: dict[str, Any] = {}

    def fill(work: Path) -> None:
        cut_checkpoint(checkpoint, run, work, shard_bytes, progress)
        done["selection"] = run.selection()
        cut = proxy_config(checkpoint.moe.config, checkpoint.moe, keep_n)
        manifest = make_manifest(checkpoint.path, checkpoint.moe.model, cut, done["selection"])
        unused = _unused_steps(config, inputs.record)
        if calibration is not None:
            unused["calibration"] = calibration
        done["manifest"] = {**manifest, "config": inputs.record, **unused}
        write_manifest(work, done["manifest"])
        readable(work)

    path = replace_dir(out, fill, overwrite=overwrite)
    return ExportResult(path, done["manifest"], done["selection"], embeddings=run.embeddings())


def _unused_steps(config: ExportConfig, record: dict[str, Any]) -> dict[str, Any]:
    """What the manifest says of the steps a streaming export skips. Clustering the weight view,
    or a given selection, reads no calibration data; and it never holds the model, so no
    capability target is measured."""
    why = (
        "the weight view is cut in one read of the shards and runs no model (--method cluster "
        "--streaming); drop --method cluster to read the original a layer at a time and measure"
    )
    notes: dict[str, Any] = {"calibration": {"source": record["calibration"], "used": False, "why": why}}
    if config.min_capability > 0:
        notes["targeting"] = {"min_capability": config.min_capability, "measured": False, "why": why}
    return notes


def cut_checkpoint(checkpoint: Checkpoint, run: Pass, work: Path, shard_bytes: int, progress: bool) -> None:
    """Write the proxy's shards, index, config.json and side files into ``work`` (no manifest)."""
    outputs = plan_outputs(checkpoint, run.keep, run.chosen)
    total = sum(o.out.nbytes for o in outputs)
    with _progress(None, progress, "streaming export", total=total, unit="B") as bar:
        run.run(outputs, work, shard_bytes, bar)
    _write_config(checkpoint, work, run.keep)
    copy_side_files(checkpoint.path, work)


def write_selected(model: str | Path, work: Path, selection: Selection, progress: bool = True) -> None:
    """The proxy of a given selection, cut from ``model``'s shards into ``work`` (no manifest):
    how the in-memory export writes a multimodal checkpoint, whose vision tower and projector
    the loaded language model does not hold."""
    checkpoint = open_checkpoint(model)
    chosen = given_selection(checkpoint.moe, selection, None)
    run = Pass(checkpoint, chosen.keep, chosen, chosen.seed, allow_top_k=True)
    cut_checkpoint(checkpoint, run, work, _shard_bytes(DEFAULT_SHARD_SIZE), progress)


def _selection_before_pass(
    checkpoint: Checkpoint, config: ExportConfig, inputs: ExportInputs, progress: bool
) -> tuple[int, Selection | None, dict[str, Any] | None]:
    """The kept count, the selection when it is known before the pass (``None``: clustered layer
    by layer during it), and the record of the calibration data a calibrated method read."""
    moe, method = checkpoint.moe, method_named(config.method)
    if inputs.selection is not None:
        chosen = given_selection(moe, inputs.selection, config.keep)
        return chosen.keep, chosen, None
    keep = keep_of(moe, config.keep, allow_top_k=config.allow_top_k)  # parsed once, for every step
    if method.backward:
        forward_only = [m.name for m in METHODS.values() if m.forward and not m.backward and not m.one_read]
        raise MoescopeError(
            f"method={method.name} runs a backward pass, which the one-read shard cut (export_streaming) "
            "does not; export with export_proxy (moescope export), which reads the original a "
            f"decoder layer at a time, or give method {', '.join(forward_only)} here."
        )
    if method.one_read:  # chosen layer by layer during the cutting pass
        return keep.fixed(), None, None
    if method.forward:
        chosen, record = calibrated_selection(checkpoint.path, config, inputs.calibration, keep, progress)
        return keep.fixed(), chosen, record
    options = {"method": method.name, "seed": config.seed, "allow_top_k": config.allow_top_k}
    return keep.fixed(), select_experts(moe, keep, **options), None


def _write_config(checkpoint: Checkpoint, work: Path, keep: int) -> None:
    """config.json as the source wrote it, with the expert count (and any alias of its key) set:
    at the top level, or in the language model's section of a multimodal config."""
    data = json.loads((checkpoint.path / "config.json").read_text())
    config, key = checkpoint.moe.config, checkpoint.moe.spec.count_key
    section = language_section(data, config.model_type)
    *parents, key = key.split(".")  # DBRX keeps it in ffn_config
    for parent in parents:
        section = section.setdefault(parent, {})
    names = {key} | {alias for alias, name in config.attribute_map.items() if name == key}
    for name in names & section.keys() or {key}:
        section[name] = keep
    (work / "config.json").write_text(json.dumps(data, indent=2) + "\n")


def language_section(data: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The part of a config.json's dict that configures the language model of ``model_type``:
    the sub-config (``text_config``) of a multimodal one that has that type, else the dict itself."""
    if data.get("model_type") != model_type:
        nested = [
            value
            for value in data.values()
            if isinstance(value, dict) and value.get("model_type") == model_type
        ]
        if len(nested) == 1:
            return nested[0]
    return data


def _shard_bytes(size: int | str) -> int:
    from transformers.utils.hub import convert_file_size_to_int

    try:
        value = convert_file_size_to_int(size)
    except ValueError:
        value = 0
    if value <= 0:
        raise MoescopeError(f"max_shard_size={size!r} is not a size; use bytes or a string like '5GB'.")
    return value


def _progress(items: Any, enabled: bool, desc: str, **kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=not enabled, leave=False, unit_scale=True, **kwargs)
