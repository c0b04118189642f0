"""The whole export: ``export_proxy(model, out, ...)`` from a model to a proxy directory.

Resolve the model, choose the experts (or take a selection), cut the proxy in memory or over
the shards, heal and measure it if asked, write it with its manifest through a temporary
sibling renamed into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moescope._util.io import check_output_dir, readable, replace_dir
from moescope.errors import MoescopeError
from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import embed_experts
from moescope.explore.routing import collect_routing
from moescope.explore.selection import Selection
from moescope.export.fidelity.measure import manifest_sections, measure_fidelity, validity_checklist
from moescope.export.healing import heal
from moescope.export.manifest import copy_side_files, make_manifest, write_manifest
from moescope.export.result import ExportResult
from moescope.export.streaming.export import export_streaming, needs_streaming, write_selected
from moescope.export.surgery import build_proxy, given_selection, kept_count
from moescope.models.accuracy import TaskSpec, check_task_spec
from moescope.models.arch import adapt
from moescope.models.loading import load_model, resolve_model
from moescope.models.multimodal import is_multimodal, save_with_language_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def export_proxy(
    model: str | Path,
    out: str | Path,
    *,
    keep: str | float | int | None = None,
    selection: Selection | str | Path | None = None,
    method: str = "cluster",
    seed: int = 0,
    calibration: Any = "tasks",
    n_tokens: int = 20_000,
    allow_top_k: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    streaming: bool | None = None,
    heal_steps: int = 0,
    heal_lr: float = 1e-3,
    fidelity: bool | dict[str, Any] = True,
    tasks: TaskSpec = None,
) -> ExportResult:
    """Write a proxy of ``model`` to ``out`` (a temporary sibling, renamed at the end).

    Parameters
    ----------
    model : ``"toy"`` or a checkpoint directory.
    out : the proxy directory.
    keep : fraction, ratio or count of routed experts kept per layer; optional with a selection.
    selection : a :class:`~moescope.explore.clustering.Selection` or its ``selection.json``; computed with
        ``method`` (after a calibration pass over ``calibration``) when not given.
    method : ``cluster`` (default), ``frequency``, ``reap`` or ``random``.
    allow_top_k : accept keeping exactly top-k experts (no routing choice left).
    overwrite : replace an existing ``out``.
    streaming : cut the safetensors shards without loading the model
        (:func:`~moescope.export.streaming.export.export_streaming`: ``cluster`` clusters the weights view,
        ``frequency`` and ``reap`` need a selection); ``None`` streams when the in-memory
        export would not fit in the memory available now.
    heal_steps, heal_lr : distil the proxy toward the original for this many steps first
        (:func:`moescope.export.healing.heal`: only router rows and kept experts train).
    fidelity : measure fidelity and run the validity checklist on the proxy (``True``, or the
        options of :func:`moescope.export.fidelity.measure.measure_fidelity`), recorded in the manifest.
        A streaming export never holds the models in memory, so it measures nothing.
    tasks : the tasks of the accuracy that healing and fidelity report, and that the checklist's
        task capability compares: ``None`` (the task suite for the toy, none otherwise),
        ``"toy"``, family names, or a ``.jsonl`` of ``{"prompt", "answer"}`` lines, read before
        the model loads. Needs the model in memory, with its tokenizer.
    """
    source = resolve_model(model)
    check_output_dir(out, overwrite=overwrite)  # fail in seconds, before loading anything
    named_tasks = check_task_spec(tasks)  # a bad prompt file fails before anything loads
    if heal_steps < 0:
        raise MoescopeError(f"heal_steps={heal_steps} must be 0 (no healing) or a positive number of steps.")
    if streaming is None:
        streaming = needs_streaming(source, keep=keep, selection=selection)
    if streaming:
        if heal_steps:
            raise _needs_memory(
                "healing", "heal the streamed proxy later with moescope.export.healing.heal_proxy_dir"
            )
        if named_tasks is not None:
            raise _needs_memory(
                "task accuracy",
                "measure the streamed proxy later with "
                "moescope.export.fidelity.measure.measure_fidelity(..., tasks=...)",
            )
        options = dict(method=method, seed=seed, allow_top_k=allow_top_k, overwrite=overwrite)
        return export_streaming(source, out, keep=keep, selection=selection, progress=progress, **options)
    multimodal = is_multimodal(source)
    lm, tokenizer = load_model(model, dtype="auto")
    if named_tasks is not None and tokenizer is None:
        raise MoescopeError(
            f"task accuracy needs a tokenizer, and {source} holds none; save the model's tokenizer "
            "into that directory, or export without prompts."
        )
    chosen = _resolve_selection(
        lm, tokenizer, selection, keep, method, seed, calibration, n_tokens, allow_top_k, progress
    )
    proxy = build_proxy(lm, chosen)
    assessed = _heal_and_assess(
        lm, proxy, tokenizer, chosen, heal_steps, heal_lr, fidelity, seed, calibration, tasks
    )
    manifest = make_manifest(source, lm, proxy, chosen)
    manifest.update(_manifest_sections(**assessed))

    def fill(work: Path) -> None:
        if multimodal:  # the loaded language model lacks the vision tower: cut the shards instead
            _write_multimodal(source, work, proxy, chosen, healed=bool(heal_steps), progress=progress)
        else:
            proxy.save_pretrained(work)
            copy_side_files(source, work)
        write_manifest(work, manifest)
        readable(work)

    path = replace_dir(out, fill, overwrite=overwrite)
    return ExportResult(path=path, manifest=manifest, selection=chosen, **assessed)


def _write_multimodal(
    source: Path, work: Path, proxy: PreTrainedModel, chosen: Selection, healed: bool, progress: bool
) -> None:
    """A multimodal proxy: the source's shards cut to the selection, then, when healing changed
    the language model, that model's weights put in."""
    if not healed:
        write_selected(source, work, chosen, progress=progress)
        return
    cut = work / ".cut"
    cut.mkdir()
    write_selected(source, cut, chosen, progress=progress)
    save_with_language_model(cut, proxy, work)
    copy_side_files(cut, work)
    shutil.rmtree(cut)


def _needs_memory(what: str, later: str) -> MoescopeError:
    """The one refusal of every in-memory step asked of a streaming export, with its later way."""
    return MoescopeError(
        f"{what} needs the model in memory, which a streaming export avoids; export without "
        f"--streaming, or {later}."
    )


def _heal_and_assess(
    lm: PreTrainedModel,
    proxy: PreTrainedModel,
    tokenizer: Any,
    chosen: Selection,
    heal_steps: int,
    heal_lr: float,
    fidelity: bool | dict[str, Any],
    seed: int,
    calibration: Any,
    tasks: TaskSpec,
) -> dict[str, Any]:
    """Healing (in place), then fidelity and the validity checklist of the proxy as it will be saved."""
    data = _data_for(lm, tokenizer, calibration, seed)
    healing = None
    if heal_steps:
        healing = heal(
            lm, proxy, data, tokenizer=tokenizer, steps=heal_steps, lr=heal_lr, seed=seed, tasks=tasks
        )
    if not fidelity:
        return {"fidelity": None, "checklist": None, "healing": healing}
    options = {"seed": seed, "tasks": tasks, **(fidelity if isinstance(fidelity, dict) else {})}
    held_out = "tasks" if tokenizer is not None else _data_for(lm, None, "tasks", seed + 1)
    measured = measure_fidelity(lm, proxy, held_out, tokenizer=tokenizer, selection=chosen, **options)
    checks = validity_checklist(lm, proxy, measured, selection=chosen)
    return {"fidelity": measured, "checklist": checks, "healing": healing}


def _data_for(lm: PreTrainedModel, tokenizer: Any, data: Any, seed: int) -> Any:
    """Text data needs a tokenizer; a checkpoint without one (a test model) gets seeded random ids."""
    if tokenizer is not None or not isinstance(data, str):
        return data
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, lm.config.vocab_size, (64, 64), generator=generator)


def _manifest_sections(**assessed: Any) -> dict[str, Any]:
    return manifest_sections(assessed["fidelity"], assessed["checklist"], assessed["healing"])


def _resolve_selection(
    lm: PreTrainedModel,
    tokenizer: Any,
    selection: Selection | str | Path | None,
    keep: str | float | int | None,
    method: str,
    seed: int,
    calibration: Any,
    n_tokens: int,
    allow_top_k: bool,
    progress: bool,
) -> Selection:
    moe = adapt(lm)
    if selection is not None:
        return given_selection(moe, selection, keep)
    kept_count(moe, keep, allow_top_k)  # refuse an impossible keep before the calibration pass
    stats, embeddings = None, None
    if method != "random":
        data = _data_for(lm, tokenizer, calibration, seed)
        stats = collect_routing(
            lm, data, tokenizer=tokenizer, n_tokens=n_tokens, seed=seed, progress=progress
        )
    if method == "cluster":
        embeddings = embed_experts(lm, "multiview", stats=stats, seed=seed, progress=progress)
    return select_experts(
        lm, keep, method=method, embeddings=embeddings, stats=stats, seed=seed, allow_top_k=allow_top_k
    )
