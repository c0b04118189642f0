"""The whole export: ``export_proxy(model, config, out=...)`` from a model to a proxy directory.

Resolve the model and where to read it (in memory, or a decoder layer at a time:
:mod:`moescope.export.gather`), make the calibration data once (on first use: the ``"rl"``
samples take a generation pass), choose the experts (or take a selection), cut the proxy in
memory or from the shards, heal it if asked, heal it toward its capability target or search the kept count
(:mod:`moescope.export.targeting`), measure it, and write it with its manifest (which records
the :class:`~moescope.export.config.ExportConfig`, the calibration data and the targeting)
through a temporary sibling renamed into place.
"""

from __future__ import annotations

import functools
import inspect
import shutil
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.io import check_output_dir, readable, replace_dir
from moescope.errors import MoescopeError
from moescope.explore.calibration import calibration_data, calibration_record, check_source
from moescope.explore.clustering import select_experts
from moescope.explore.embeddings import embed_experts
from moescope.explore.methods import (
    METHODS,
    ROUTERS,
    ROUTING_SUMS,
    TAYLOR,
    WEIGHTS,
    Method,
    auto_candidates,
    needs_of,
)
from moescope.explore.methods import method as method_named
from moescope.explore.routing import collect_routing
from moescope.explore.selection import Selection
from moescope.explore.sequential import checkpoint_reads, data_width, fit_pass, pass_batch_size, router_rows
from moescope.explore.taylor import supports_taylor, taylor_importance
from moescope.export.boundary import check_inputs
from moescope.export.config import AUTO, ExportConfig, ExportInputs, configure, resolve_method
from moescope.export.fidelity import CAPABILITY_THRESHOLD
from moescope.export.fidelity.agreement import SCORED_BYTES
from moescope.export.fidelity.measure import manifest_sections, measure_fidelity, validity_checklist
from moescope.export.fidelity.original_record import ORIGINAL_ACCURACY_NAME, export_original_accuracy
from moescope.export.gather import Gathered, Placement, check_budget, gather, placement_for
from moescope.export.healing import BATCH_SIZE, SEQ_LEN, heal, training_batches
from moescope.export.manifest import copy_side_files, make_manifest, write_manifest
from moescope.export.method_choice import AUTO_METHOD, FALLBACK, MethodChoices, choosing_selector
from moescope.export.result import ExportResult
from moescope.export.streaming.export import export_streaming, write_selected
from moescope.export.surgery import given_selection, keep_of, proxy_config
from moescope.export.targeting import CapabilityProbe, Targeting, reach_target, record_fixed, target_auto
from moescope.export.teacher import TeacherRounds
from moescope.keep import Keep
from moescope.models.accuracy import check_task_spec, resolve_tasks
from moescope.models.lm_head import head_runs_apart
from moescope.models.loading import load_config, resolve_model
from moescope.models.multimodal import is_multimodal, save_with_language_model
from moescope.models.resident import read_per_forward
from moescope.models.view import adapt

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from moescope.export.fidelity.agreement import Batch

Data = Callable[[], Any]  # the calibration data, made on the first call


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

    The keyword form ``export_proxy(model, out, keep=..., method=..., ...)`` works as well. An
    original that does not fit beside a proxy in ``max_memory`` (or with ``streaming=True``) is
    read a decoder layer at a time, and every step runs on it as in memory
    (:mod:`moescope.export.gather`); ``streaming=True, method="cluster"`` is the one-read
    weight-view cut, which measures nothing. The manifest records the config under ``"config"``
    and where the original was read under ``"original"``.

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
    check_source(inputs.calibration)  # so does a calibration file without text
    compute = check_inputs(source, config, inputs.calibration)  # device, dtype, config: before any read
    keep = _keep(source, config, inputs)  # and an impossible keep, parsed here once for every step
    placement = placement_for(source, keep, inputs.selection, config.streaming, config.max_memory, compute)
    if placement.sequential and config.streaming and _one_read(config.method):
        _refuse_in_memory_steps(config, named_tasks)  # the weight view, cut in one read
        return export_streaming(
            source, out, config, overwrite=overwrite, progress=progress, **inputs.objects()
        )
    config, inputs = resolve_method(config, inputs)
    check_budget(placement, heals_proxy=bool(config.heal_steps))
    if placement.sequential and inputs.selection is None:
        _check_gatherer(config.method, placement)
    plan = (config, inputs, keep, named_tasks)
    return _export_planned(model, source, out, plan, overwrite, progress, placement)


def _one_read(method: str | None) -> bool:
    """Whether ``method`` is chosen during the one-read shard cut (not ``auto``, not unset)."""
    return method in METHODS and METHODS[method].one_read


def _check_gatherer(method: str, placement: Placement) -> None:
    """Refuse, before anything loads, a method whose needs the layer-sequential gatherer cannot
    gather (its registry entry says so)."""
    plan = auto_candidates() if method == AUTO_METHOD else (method_named(method),)
    unsupported = [m.name for m in plan if not m.sequential]
    if unsupported:
        raise MoescopeError(
            f"--method {method} needs the original in memory ({', '.join(unsupported)}), and it is read "
            f"a decoder layer at a time since {placement.why}; raise --max-memory or choose another --method."
        )


def _keep(source: Path, config: ExportConfig, inputs: ExportInputs) -> Keep | None:
    """``config.keep`` parsed once against the checkpoint's routing, read from its config before
    anything loads (``None``: the selection's count); ``"auto"``'s candidates checked too."""
    if config.keep is None and inputs.selection is not None:
        return None
    allow_top_k = config.allow_top_k or inputs.selection is not None  # a selection may keep top-k
    keep = keep_of(load_config(source), config.keep, allow_top_k=allow_top_k, allow_auto=True)
    if keep.searched:
        keep.candidates()  # refuse a model with no count to try
    return keep


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


def _export_planned(
    model: str | Path,
    source: Path,
    out: str | Path,
    plan: tuple[ExportConfig, ExportInputs, Keep | None, Any],
    overwrite: bool,
    progress: bool,
    placement: Placement,
) -> ExportResult:
    """Read the original where ``placement`` says; choose, cut, heal and measure; write the proxy
    and its manifest. The steps are the same whichever gatherer reads the original. ``plan``:
    the config, its inputs, the parsed keep and the named tasks."""
    config, inputs, keep, named_tasks = plan
    multimodal = is_multimodal(source)
    with gather(model, source, placement, out=Path(out)) as got:
        lm, tokenizer = got.original, got.tokenizer
        if named_tasks is not None and tokenizer is None:
            raise MoescopeError(
                f"task accuracy needs a tokenizer, and {source} holds none; save the model's tokenizer "
                "into that directory, or export without prompts."
            )
        if keep is not None and keep.searched and (why := _unmeasured(lm, tokenizer, config)):
            raise MoescopeError(
                f"keep=auto measures each candidate's task accuracy, which is not possible here: {why}."
            )
        data = _calibration(lm, tokenizer, config, inputs)
        choices = MethodChoices() if config.method == AUTO_METHOD and inputs.selection is None else None
        known = functools.cache(lambda: _known_original(got, config, inputs))
        probe = functools.cache(lambda: _capability_probe(lm, tokenizer, config, known()[0]))
        select = _selector(got, config, inputs, keep, data, progress, choices, probe)
        chosen, proxy, healing, targeting = _cut_and_heal(got, config, keep, data, select, probe)
        assessed = _assess(lm, proxy, tokenizer, chosen, config, known()[0] if config.fidelity else None)
        cut = proxy if proxy is not None else proxy_config(lm.config, adapt(lm), chosen.keep)
        manifest = make_manifest(source, lm, cut, chosen)
        reads = checkpoint_reads(lm)
        measured_proxy = _proxy_read(got, proxy)
    manifest.update(manifest_sections(assessed["fidelity"], assessed["checklist"], healing))
    manifest.update(config=inputs.record, calibration=_calibration_record(data, inputs.record["calibration"]))
    manifest.update(_targeting_section(lm, tokenizer, config, targeting))
    manifest["original"] = placement.record(lm)
    if placement.sequential:
        manifest["original"]["checkpoint_reads"] = reads
    if measured_proxy:
        manifest["proxy_read"] = measured_proxy
    if known.cache_info().currsize:  # type: ignore[attr-defined]
        manifest["original"]["accuracy"] = known()[1]
    if choices is not None:
        manifest["method_choice"] = choices.to_dict()

    def fill(work: Path) -> None:
        if proxy is None or read_per_forward(proxy):  # not healed: cut from the shards, as measured
            write_selected(source, work, chosen, progress=progress)
        elif multimodal:  # the loaded language model lacks the vision tower: cut the shards instead
            healed = bool(healing or (targeting and targeting.chosen.steps))
            _write_multimodal(source, work, proxy, chosen, healed=healed, progress=progress)
        else:
            proxy.save_pretrained(work)
            copy_side_files(source, work)
        write_manifest(work, manifest)
        readable(work)

    path = replace_dir(out, fill, overwrite=overwrite)
    return ExportResult(
        path=path, manifest=manifest, selection=chosen, healing=healing, targeting=targeting, **assessed
    )


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
    """The one refusal of every step that reads the model asked of the one-read weight-view cut."""
    return MoescopeError(
        f"{what} reads the model, which --method cluster with --streaming (the weight view, cut in "
        f"one read) never does; drop --method cluster (every other method reads the original a "
        f"layer at a time), or {later}."
    )


def _refuse_in_memory_steps(config: ExportConfig, named_tasks: Any) -> None:
    """Healing, task accuracy and ``keep=auto`` need the model, which the one-read weight-view
    cut (``streaming=True, method="cluster"``) never loads."""
    if config.keep == AUTO:
        raise _needs_memory("keep=auto", "give a --keep")
    if config.method == AUTO_METHOD:
        raise _needs_memory("method=auto (measuring each candidate's proxy)", "give a --method")
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


def _calibration(lm: PreTrainedModel, tokenizer: Any, config: ExportConfig, inputs: ExportInputs) -> Data:
    """The calibration data, made once and only when first needed (the routing pass, healing)."""
    source, seed, n = inputs.calibration, config.seed, config.n_tokens
    prompts = config.tasks  # "rl" samples the replay's prompts: the task suite or the prompt file
    return functools.cache(
        lambda: calibration_data(lm, tokenizer, source, n_tokens=n, seed=seed, prompts=prompts)
    )


def _calibration_record(data: Data, source: str) -> dict[str, Any]:
    """What the manifest says of the calibration data: the RL data's counts, else its source."""
    if not data.cache_info().currsize:  # type: ignore[attr-defined]
        return {"source": source, "used": False}
    return calibration_record(data(), source)


def _selector(
    got: Gathered,
    config: ExportConfig,
    inputs: ExportInputs,
    keep: Keep | None,
    data: Data,
    progress: bool,
    choices: MethodChoices | None,
    probe: Callable[[], CapabilityProbe],
) -> Callable[[Any], Selection]:
    """``keep → Selection``: the given selection checked against the model, or experts chosen by
    ``config.method`` from what the method's registry entry needs, gathered once whatever counts
    are asked of it; ``auto`` measures its candidates' proxies, recording each choice in ``choices``."""
    lm, tokenizer = got.original, got.tokenizer
    moe = adapt(lm)
    method = config.method
    if inputs.selection is not None:
        if keep is not None and keep.searched:
            raise MoescopeError(
                "keep=auto chooses the experts itself; drop the selection (it fixes the count)."
            )
        return lambda keep: given_selection(moe, inputs.selection, keep)  # type: ignore[arg-type]
    if choices is not None:
        choices.why = _no_tasks(lm, tokenizer, config)
        method = FALLBACK if choices.why else method
    plan = (
        auto_candidates(backward=supports_taylor(moe)) if method == AUTO_METHOD else (method_named(method),)
    )
    gathered = _gather_needs(got, needs_of(plan), data, config, progress)

    def selector(spec: Method) -> Callable[[Any], Selection]:
        options = {"method": spec.name, "seed": config.seed, **gathered}
        if spec.views:
            options.update(views=config.views, view_weights=config.view_weights)
        return lambda keep: select_experts(lm, keep, allow_top_k=config.allow_top_k, **options)

    if method == AUTO_METHOD:
        assert choices is not None
        return choosing_selector(got.cut, {m.name: selector(m) for m in plan}, probe(), choices)
    return selector(plan[0])


def _gather_needs(
    got: Gathered, needs: frozenset[str], data: Data, config: ExportConfig, progress: bool
) -> dict[str, Any]:
    """What the planned methods need of the original, each gathered once: the routing sums of one
    calibration pass (the router rows read while each layer runs), the clustered embeddings of
    the weights, Taylor scores of a backward pass; as :func:`select_experts`' keywords."""
    lm, seed = got.original, config.seed
    options = {"n_tokens": config.n_tokens, "seed": seed, "tokenizer": got.tokenizer, "progress": progress}
    found: dict[str, Any] = {"stats": None, "embeddings": None, "routers": None, "taylor": None}
    if needs & (ROUTING_SUMS | {ROUTERS}):
        with router_rows(lm) if ROUTERS in needs else nullcontext() as found["routers"]:
            found["stats"] = collect_routing(lm, data(), **_fit(got, data(), options))
    if WEIGHTS in needs:
        found["embeddings"] = embed_experts(
            lm, "multiview", stats=found["stats"], seed=seed, progress=progress
        )
    if TAYLOR in needs:
        found["taylor"] = taylor_importance(lm, data(), **_fit(got, data(), options, backward=True))
    return found


def _fit(got: Gathered, data: Any, options: dict[str, Any], backward: bool = False) -> dict[str, Any]:
    """A calibration pass's options: the in-memory pass's, or, layer-sequentially, as many rows
    per batch as memory holds beside a layer (each batch reads every layer from the shards)."""
    if not got.placement.sequential:
        return options
    return fit_pass(got.original, data, options, backward=backward)


def _cut_and_heal(
    got: Gathered,
    config: ExportConfig,
    keep: Keep | None,
    data: Data,
    select: Callable[[Any], Selection],
    measure: Callable[[], CapabilityProbe],
) -> tuple[Selection, PreTrainedModel, Any, Targeting | None]:
    """The proxy of ``config.keep`` (healed ``heal_steps``, then toward the target), or of the
    count ``keep="auto"`` finds; with its selection, healing report and targeting record.
    ``measure``: the capability probe, taken only where there is a target to measure."""
    lm, tokenizer = got.original, got.tokenizer
    probe = None if config.min_capability <= 0 or _unmeasured(lm, tokenizer, config) else measure()
    got.heals = bool(config.heal_steps)
    got.targets = probe is not None  # a target is reached by healing, where the proxy falls short
    batches, teacher = _healing_data(got, config, data)
    if keep is not None and keep.searched:
        assert probe is not None  # refused before the calibration pass otherwise
        chosen, proxy, targeting = target_auto(lm, select, probe, batches(), config, got.cut, teacher, keep)
        return chosen, proxy, None, targeting
    chosen = select(keep)
    if got.placement.sequential and not loads_proxy(config):
        return chosen, None, None, None  # written from the shards, as it is
    proxy = got.cut(chosen)
    healing = None
    if config.heal_steps:
        steps, lr, seed = config.heal_steps, config.heal_lr, config.seed
        cache = teacher().upto(steps) if teacher else None  # before and after: the tasks in memory only
        tasks = () if cache is not None else config.tasks
        options = {"steps": steps, "lr": lr, "seed": seed, "tasks": tasks, "teacher": cache}
        healing = heal(lm, proxy, data(), tokenizer=tokenizer, **options)
    if probe is None:
        return chosen, proxy, healing, None
    attempt = reach_target(lm, proxy, chosen, probe, batches(), config, teacher)
    return chosen, proxy, healing, record_fixed(attempt, config)


def _healing_data(
    got: Gathered, config: ExportConfig, data: Data
) -> tuple[Callable[[], Iterator[Batch]], Callable[[], Any] | None]:
    """Healing's batches, and what it distils from where that is not the original itself: an
    original read a layer at a time gives its top-k next-token distributions on the batches
    healing draws within its budget (:func:`~moescope.export.healing.training_batches`, RL data
    sampled on from the original as an in-memory export does), a round of ``heal_round`` batches
    at a time when healing first reaches it, each in as few passes as memory allows
    (:class:`~moescope.export.teacher.TeacherRounds`): the original runs on the batches an
    in-memory export runs it on, not on the whole budget's."""
    lm, tokenizer = got.original, got.tokenizer
    shape = {"batch_size": BATCH_SIZE, "seq_len": SEQ_LEN, "seed": config.seed}
    if not got.placement.sequential:
        return lambda: training_batches(data(), tokenizer, model=lm, **shape), None
    steps = max(config.heal_steps, config.heal_budget if config.min_capability > 0 else 0, 1)
    size = config.heal_round if config.min_capability > 0 else steps
    rounds = functools.partial(training_batches, model=lm, round_steps=size, **shape)
    teacher = functools.cache(lambda: TeacherRounds(lm, rounds(data(), tokenizer), steps=steps, size=size))
    return lambda: iter(teacher()), teacher  # every round of every attempt stays within the budget


def _proxy_read(got: Gathered, proxy: PreTrainedModel | None) -> dict[str, Any]:
    """The manifest's ``"proxy_read"``: how the proxy cut from a layer-sequential original's
    shards was read to be measured (whole, or a decoder layer at a time), why, and how many
    times its own cut was read (``{}``: none cut from the shards)."""
    if proxy is None or not got.proxy_read:
        return {}
    return {**got.proxy_read, "checkpoint_reads": checkpoint_reads(proxy)}


def loads_proxy(config: ExportConfig) -> bool:
    """Whether the export cuts the proxy to measure it, heal it, or measure ``auto``'s
    candidates: loaded whole, or read a layer at a time from its cut where it does not fit.
    Otherwise an original read a layer at a time gives a proxy cut from its shards and never
    read, however large."""
    return bool(config.fidelity or config.heal_steps or config.keep == AUTO or config.method == AUTO_METHOD)


def _unmeasured(lm: PreTrainedModel, tokenizer: Any, config: ExportConfig) -> str:
    """Why a capability target cannot be measured ("" when it can, or there is none)."""
    if config.min_capability <= 0:
        return ""
    if not config.fidelity:
        return "fidelity is off, so nothing is measured"
    return _no_tasks(lm, tokenizer, config)


def _no_tasks(lm: PreTrainedModel, tokenizer: Any, config: ExportConfig) -> str:
    """Why no task accuracy can be measured ("" when it can)."""
    if tokenizer is None or resolve_tasks(config.tasks, lm) is None:
        return 'no tasks for this model; give --prompts FILE (a .jsonl of {"prompt", "answer"} lines)'
    return ""


def _targeting_section(
    lm: PreTrainedModel, tokenizer: Any, config: ExportConfig, targeting: Targeting | None
) -> dict[str, Any]:
    """The manifest's ``"targeting"``: the record, or why a target was not measured (or nothing)."""
    if targeting is not None:
        return {"targeting": targeting.to_dict()}
    why = _unmeasured(lm, tokenizer, config)
    return (
        {"targeting": {"min_capability": config.min_capability, "measured": False, "why": why}} if why else {}
    )


def _known_original(got: Gathered, config: ExportConfig, inputs: ExportInputs) -> tuple[Any, dict[str, Any]]:
    """The original's accuracy (given, or teacher-forced and kept beside the selection file or in
    the cache), with its record; ``None`` without tasks."""
    tasks = resolve_tasks(config.tasks, got.original)
    if tasks is None:
        return None, {}
    selection = inputs.selection
    beside = Path(selection).with_name(ORIGINAL_ACCURACY_NAME) if isinstance(selection, str) else None
    return export_original_accuracy(
        got.original,
        got.tokenizer,
        tasks,
        given=config.original_accuracy,
        path=beside,
        **_fidelity_options(config),
    )


def _fidelity_default(name: str) -> Any:
    return inspect.signature(measure_fidelity).parameters[name].default


def _fidelity_options(config: ExportConfig) -> dict[str, Any]:
    """The task-accuracy settings the fidelity measurement takes (its prompts, samples, seed)."""
    given = config.fidelity if isinstance(config.fidelity, dict) else {}
    options = {name: given.get(name, _fidelity_default(name)) for name in ("n_prompts", "samples")}
    return {**options, "seed": given.get("seed", config.seed)}


def _capability_probe(
    lm: PreTrainedModel, tokenizer: Any, config: ExportConfig, known: Any = None
) -> CapabilityProbe:
    """The capability measurement as the fidelity measurement will take it (its tasks, prompt
    count, samples and seed), against the target (the checklist's threshold without one)."""
    tasks = resolve_tasks(config.tasks, lm)
    threshold = config.min_capability or CAPABILITY_THRESHOLD
    options = _fidelity_options(config)
    return CapabilityProbe(lm, tokenizer, tasks, threshold=threshold, known=known, **options)


def _assess(
    lm: PreTrainedModel,
    proxy: PreTrainedModel,
    tokenizer: Any,
    chosen: Selection,
    config: ExportConfig,
    known: Any = None,
) -> dict[str, Any]:
    """Fidelity and the validity checklist of the proxy as it will be saved; the capability check
    asks for the target (the checklist's own threshold without one). ``known``: the original's
    accuracy frame the export measured once (:func:`_known_original`)."""
    seed, tasks, fidelity = config.seed, config.tasks, config.fidelity
    if not fidelity:
        return {"fidelity": None, "checklist": None}
    options = {"seed": seed, "tasks": tasks, **(fidelity if isinstance(fidelity, dict) else {})}
    held_out = calibration_data(lm, tokenizer, seed=seed + 1)
    if read_per_forward(lm):  # each forward reads the checkpoint: the same rows in fewer
        shape = {name: options.get(name, _fidelity_default(name)) for name in ("n_tokens", "seq_len")}
        shape["seq_len"] = data_width(held_out, tokenizer, **shape, seed=seed)
        vocab = lm.config.get_text_config().vocab_size  # whole logits, unless the head runs apart
        logits = None if head_runs_apart(lm) else SCORED_BYTES * shape["seq_len"] * vocab
        options["rows_per_forward"] = pass_batch_size(lm, **shape, logits=logits)
    measured = measure_fidelity(
        lm, proxy, held_out, tokenizer=tokenizer, selection=chosen, original_accuracy=known, **options
    )
    threshold = config.min_capability or CAPABILITY_THRESHOLD
    checks = validity_checklist(lm, proxy, measured, selection=chosen, accuracy_threshold=threshold)
    return {"fidelity": measured, "checklist": checks}
