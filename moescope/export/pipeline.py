"""The whole export: ``export_proxy(model, config, out=...)`` from a model to a proxy directory.

Resolve the model, choose the experts (or take a selection), cut the proxy in memory or over
the shards, heal and measure it if asked, write it with its manifest (which records the
:class:`~moescope.export.config.ExportConfig`) through a temporary sibling renamed into place.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.io import check_output_dir, readable, replace_dir
from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_data
from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import embed_experts
from moescope.explore.routing import collect_routing
from moescope.explore.selection import Selection
from moescope.export.config import ExportConfig, ExportInputs, configure
from moescope.export.fidelity.measure import manifest_sections, measure_fidelity, validity_checklist
from moescope.export.healing import heal
from moescope.export.manifest import copy_side_files, make_manifest, write_manifest
from moescope.export.result import ExportResult
from moescope.export.streaming.export import export_streaming, needs_streaming, write_selected
from moescope.export.surgery import build_proxy, given_selection, kept_count
from moescope.models.accuracy import check_task_spec
from moescope.models.loading import load_model, resolve_model
from moescope.models.multimodal import is_multimodal, save_with_language_model
from moescope.models.view import adapt

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def export_proxy(
    model: str | Path,
    config: ExportConfig | str | Path | None = None,
    *,
    out: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
    **options: Any,
) -> ExportResult:
    """Write a proxy of ``model`` to ``out`` (a temporary sibling, renamed at the end).

    Parameters
    ----------
    model : ``"toy"`` or a checkpoint directory.
    config : which experts to keep and what is done to the proxy
        (:class:`~moescope.export.config.ExportConfig`; default ``ExportConfig()``).
    out : the proxy directory.
    overwrite : replace an existing ``out``.
    progress : show progress bars.
    **options : ``ExportConfig`` fields, put into ``config``; ``selection`` may also be a
        :class:`~moescope.explore.selection.Selection`, and ``calibration`` token ids.

    The keyword form ``export_proxy(model, out, keep=..., method=..., ...)`` works as well. A
    streaming export never holds the models in memory: it measures nothing, and refuses healing
    and task accuracy. The manifest records the config under ``"config"``.

    Examples
    --------
    >>> import tempfile
    >>> from moescope.models.zoo import tiny
    >>> config = ExportConfig(keep="1/2", method="random", fidelity=False)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     tiny("mixtral").save_pretrained(f"{tmp}/model")
    ...     result = export_proxy(f"{tmp}/model", config, out=f"{tmp}/proxy", progress=False)
    >>> result.manifest["keep"], result.manifest["config"]["method"]
    (4, 'random')
    """
    config, inputs, out = _arguments(config, out, options)
    source = resolve_model(model)
    check_output_dir(out, overwrite=overwrite)  # fail in seconds, before loading anything
    named_tasks = check_task_spec(config.tasks)  # a bad prompt file fails before anything loads
    streaming = config.streaming
    if streaming is None:
        streaming = needs_streaming(source, keep=config.keep, selection=inputs.selection)
    if streaming:
        _refuse_in_memory_steps(config, named_tasks)
        objects = inputs.objects()
        return export_streaming(source, out, config, overwrite=overwrite, progress=progress, **objects)
    return _export_in_memory(model, source, out, config, inputs, named_tasks, overwrite, progress)


def _arguments(
    config: ExportConfig | str | Path | None, out: str | Path | None, options: dict[str, Any]
) -> tuple[ExportConfig, ExportInputs, str | Path]:
    """The config, the inputs beside it and the output, from either call form: ``(model, config,
    out=...)``, or the keyword form ``(model, out, keep=..., ...)`` whose second argument is the
    output. Keywords override the config's fields."""
    if not isinstance(config, ExportConfig):
        if config is not None and out is not None:
            raise TypeError("export_proxy() got two outputs; pass an ExportConfig second, or out= alone.")
        config, out = None, out if config is None else config
    if out is None:
        raise TypeError("export_proxy() needs out=, the proxy directory.")
    config, inputs = configure(config, options)
    return config, inputs, out


def _export_in_memory(
    model: str | Path,
    source: Path,
    out: str | Path,
    config: ExportConfig,
    inputs: ExportInputs,
    named_tasks: Any,
    overwrite: bool,
    progress: bool,
) -> ExportResult:
    """Load the model; choose, cut, heal and measure in memory; write the proxy and its manifest."""
    multimodal = is_multimodal(source)
    lm, tokenizer = load_model(model, dtype="auto")
    if named_tasks is not None and tokenizer is None:
        raise MoescopeError(
            f"task accuracy needs a tokenizer, and {source} holds none; save the model's tokenizer "
            "into that directory, or export without prompts."
        )
    chosen = _resolve_selection(lm, tokenizer, config, inputs, progress)
    proxy = build_proxy(lm, chosen)
    assessed = _heal_and_assess(lm, proxy, tokenizer, chosen, config, inputs.calibration)
    manifest = make_manifest(source, lm, proxy, chosen)
    manifest.update(_manifest_sections(**assessed), config=inputs.record)

    def fill(work: Path) -> None:
        if multimodal:  # the loaded language model lacks the vision tower: cut the shards instead
            healed = bool(config.heal_steps)
            _write_multimodal(source, work, proxy, chosen, healed=healed, progress=progress)
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


def _refuse_in_memory_steps(config: ExportConfig, named_tasks: Any) -> None:
    """Healing and task accuracy need the model in memory, which a streaming export never loads."""
    if config.heal_steps:
        raise _needs_memory(
            "healing", "heal the streamed proxy later with moescope.export.healing.heal_proxy_dir"
        )
    if named_tasks is not None:
        raise _needs_memory(
            "task accuracy",
            "measure the streamed proxy later with "
            "moescope.export.fidelity.measure.measure_fidelity(..., tasks=...)",
        )


def _heal_and_assess(
    lm: PreTrainedModel,
    proxy: PreTrainedModel,
    tokenizer: Any,
    chosen: Selection,
    config: ExportConfig,
    calibration: Any,
) -> dict[str, Any]:
    """Healing (in place), then fidelity and the validity checklist of the proxy as it will be saved."""
    seed, tasks, fidelity = config.seed, config.tasks, config.fidelity
    healing = None
    if config.heal_steps:
        data = calibration_data(lm, tokenizer, calibration, seed=seed)
        steps, lr = config.heal_steps, config.heal_lr
        healing = heal(lm, proxy, data, tokenizer=tokenizer, steps=steps, lr=lr, seed=seed, tasks=tasks)
    if not fidelity:
        return {"fidelity": None, "checklist": None, "healing": healing}
    options = {"seed": seed, "tasks": tasks, **(fidelity if isinstance(fidelity, dict) else {})}
    held_out = calibration_data(lm, tokenizer, seed=seed + 1)
    measured = measure_fidelity(lm, proxy, held_out, tokenizer=tokenizer, selection=chosen, **options)
    checks = validity_checklist(lm, proxy, measured, selection=chosen)
    return {"fidelity": measured, "checklist": checks, "healing": healing}


def _manifest_sections(**assessed: Any) -> dict[str, Any]:
    return manifest_sections(assessed["fidelity"], assessed["checklist"], assessed["healing"])


def _resolve_selection(
    lm: PreTrainedModel, tokenizer: Any, config: ExportConfig, inputs: ExportInputs, progress: bool
) -> Selection:
    """The given selection checked against the model, or one chosen by ``config.method``."""
    moe = adapt(lm)
    keep, method, seed = config.keep, config.method, config.seed
    if inputs.selection is not None:
        return given_selection(moe, inputs.selection, keep)
    kept_count(moe, keep, config.allow_top_k)  # refuse an impossible keep before the calibration pass
    stats, embeddings = None, None
    if method != "random":
        data = calibration_data(lm, tokenizer, inputs.calibration, seed=seed)
        stats = collect_routing(
            lm, data, tokenizer=tokenizer, n_tokens=config.n_tokens, seed=seed, progress=progress
        )
    if method == "cluster":
        embeddings = embed_experts(lm, "multiview", stats=stats, seed=seed, progress=progress)
    return select_experts(
        lm, keep, method=method, embeddings=embeddings, stats=stats, seed=seed, allow_top_k=config.allow_top_k
    )
