"""Proxy export: keep the selected routed experts of every MoE layer, leave the rest bit-identical.

A proxy is the source checkpoint with, in every MoE layer, only the kept routed experts: their
expert tensors, their router rows, router-bias entries and correction-bias entries. Attention,
norms, embeddings, shared experts, dense layers and the LM head are copied unchanged; the
config's expert count is rewritten under the architecture's own key; top-k and grouped
routing are left as they are (the selection guarantees they stay valid). The result is a
plain Hugging Face directory that ``AutoModelForCausalLM.from_pretrained`` loads with no
moescope code, plus ``moescope.json``, the manifest that says how it was made. A multimodal
checkpoint (Llama 4, Qwen3.5-MoE, Qwen4-Exp) is read through its language model; its proxy is the whole
checkpoint, written by cutting the shards (:func:`moescope.streaming.write_selected`), so the
vision tower and projector, which the loaded language model does not hold, are copied too.

Expert ``j`` of a proxy layer is the ``j``-th kept original expert (kept ids are sorted, so the
original order is kept); the manifest maps proxy experts back to original indices.

Routing on the proxy (what "exact" means)
-----------------------------------------
For a token whose original top-k experts were all kept (and, under grouped routing, whose
chosen groups stay chosen), the proxy chooses the same experts. Their weights are:

* **identical** when the weights depend only on the chosen experts: renormalized softmax
  (Mixtral, Qwen3 with ``norm_topk_prob``, HunYuan, ERNIE; DBRX, whose division by the
  chosen weights' p-norm cancels any common scale too), sigmoid scores (DeepSeek-V3,
  GLM-4-MoE, dots, Kimi-Linear, MiMo-V2-Flash, Nemotron-H, A.X, HY-V3/V4, MiniMax-M2/M3, LFM2, AFMoE,
  Beam, Bailing-Hybrid, Flint, Inkling 2 (and Loop), Laguna with its soft-capped logits, with or without
  renormalization), softmax over the chosen logits (GPT-OSS, Granite, Cohere2-MoE, Aria),
  sigmoid of the chosen logits (Llama 4, Cohere2-MoE's sigmoid selection, Kolibri-1);
* **scaled by 1 / P_kept** when the weights are softmax probabilities over all experts without
  renormalization (Qwen2-MoE, OLMoE, Jamba, DeepSeek-V2, Qwen3 without ``norm_topk_prob``,
  DBRX with ``moe_normalize_expert_weights: null``):
  the softmax runs over the kept experts only, so each chosen weight is divided by the
  probability mass ``P_kept`` the kept experts had in the original;
* **changed** for PhiMoE's sparsemixer, whose weights are a softmax over the experts near the
  best one, some of which may be gone.

ERNIE adds its correction bias to the softmax probabilities to choose, so a choice can also
change when the kept probabilities grow; :func:`weight_semantics` names each case.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from moescope import __version__
from moescope._accuracy import TaskSpec, check_task_spec
from moescope._io import check_output_dir, readable, replace_dir
from moescope._multimodal import is_multimodal, save_with_language_model
from moescope.arch import MoEModel, adapt, set_config_value, take_experts
from moescope.clustering import Selection, select_experts
from moescope.errors import MoescopeError
from moescope.keep import parse_keep
from moescope.looping import loop_times_of
from moescope.provenance import config_hash, library_versions
from moescope.routers import RoutingRule

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from moescope._validity import Check
    from moescope.embeddings import ExpertEmbeddings
    from moescope.fidelity import Fidelity
    from moescope.healing import HealingReport

MANIFEST = "moescope.json"
MANIFEST_KIND = "moescope.proxy"
SCHEMA_VERSION = 1
# Files of a checkpoint that are not weights and that a proxy carries over unchanged.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
# Rewritten for the proxy, or describing the source only (the toy's card holds its accuracy).
_NOT_COPIED = {"config.json", "model.safetensors.index.json", MANIFEST, "toy_card.json"}

WeightSemantics = Literal["identical", "scaled", "changed"]


def weight_semantics(rule: RoutingRule) -> WeightSemantics:
    """How the proxy's routing weights relate to the original's for an unchanged choice."""
    if rule.scoring == "sparsemixer":
        return "changed"
    if rule.scoring == "softmax" and not rule.normalize:
        return "scaled"
    return "identical"


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_proxy` wrote, and what it measured on the way.

    ``embeddings`` are the weight-view vectors a streaming export clustered (when it did);
    ``fidelity``, ``checklist`` and ``healing`` are ``None`` when not measured or not done.
    """

    path: Path
    manifest: dict[str, Any]
    selection: Selection
    embeddings: ExpertEmbeddings | None = None
    fidelity: Fidelity | None = None
    checklist: list[Check] | None = None
    healing: HealingReport | None = None


# --- the surgery ---------------------------------------------------------------------------------


def expert_state_keys(moe: MoEModel) -> dict[str, tuple[int, torch.Tensor]]:
    """State-dict key → (decoder layer, tensor) of every tensor with one slice per routed expert."""
    model = moe.model
    state_keys = set(model.state_dict())
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    key_of = {id(tensor): name for name, tensor in named if name in state_keys}
    keys = {}
    for layer in moe.layers:
        for name, tensor in layer.named_expert_tensors():
            if id(tensor) not in key_of:
                raise MoescopeError(f"layer {layer.index}: {name} is not in the model's state dict.")
            keys[key_of[id(tensor)]] = (layer.index, tensor)
    return keys


def pruned_state_dict(moe: MoEModel, selection: Selection) -> dict[str, torch.Tensor]:
    """The source state dict with every per-expert tensor sliced to the kept experts.

    Tensors that are not sliced are the source's own (no copy), so the backbone stays
    bit-identical and memory grows only by the kept expert tensors.
    """
    state = moe.model.state_dict()
    for key, (layer, tensor) in expert_state_keys(moe).items():
        kept = torch.tensor(selection.kept(layer), dtype=torch.long, device=tensor.device)
        state[key] = take_experts(tensor.detach(), kept, moe.num_experts).clone()
    return state


def proxy_config(config: PretrainedConfig, moe: MoEModel, keep: int) -> PretrainedConfig:
    """A copy of ``config`` with the routed-expert count set to ``keep`` under its own key."""
    new = config.__class__.from_dict(config.to_dict())
    set_config_value(new, moe.spec.count_key, keep)
    return new


def build_proxy(model: PreTrainedModel, selection: Selection) -> PreTrainedModel:
    """The proxy as a fresh model of the same class, from the pruned state dict.

    Built from its config rather than edited in place, so no cached expert count survives
    (``*ForCausalLM.num_experts`` feeds the aux loss); tensors keep their source dtypes.
    """
    from transformers import AutoModelForCausalLM

    moe = adapt(model)
    selection.check_model(model.config)
    config = proxy_config(model.config, moe, selection.keep)
    state = pruned_state_dict(moe, selection)
    dtype = next(iter(state.values())).dtype
    with torch.device("meta"):
        proxy = AutoModelForCausalLM.from_config(config, dtype=dtype)
    proxy.load_state_dict(state, strict=True, assign=True)
    _materialize_buffers(proxy, model)
    proxy.tie_weights()
    return proxy.eval()


def _materialize_buffers(proxy: torch.nn.Module, source: torch.nn.Module) -> None:
    """Non-persistent buffers (rotary frequencies) are not in a state dict: copy the source's."""
    source_buffers = dict(source.named_buffers())
    for name, buffer in list(proxy.named_buffers()):
        if buffer.is_meta:
            owner_name, _, attr = name.rpartition(".")
            owner = proxy.get_submodule(owner_name) if owner_name else proxy
            owner.register_buffer(attr, source_buffers[name].clone(), persistent=False)
    for module, source_module in zip(proxy.modules(), source.modules(), strict=True):
        for attr in ("original_inv_freq",):  # plain tensor attributes some rotary classes keep
            value = getattr(source_module, attr, None)
            if isinstance(value, torch.Tensor):
                setattr(module, attr, value.clone())


# --- the whole export ----------------------------------------------------------------------------


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
    selection : a :class:`~moescope.clustering.Selection` or its ``selection.json``; computed with
        ``method`` (after a calibration pass over ``calibration``) when not given.
    method : ``cluster`` (default), ``frequency``, ``reap`` or ``random``.
    allow_top_k : accept keeping exactly top-k experts (no routing choice left).
    overwrite : replace an existing ``out``.
    streaming : cut the safetensors shards without loading the model
        (:func:`~moescope.streaming.export_streaming`: ``cluster`` clusters the weights view,
        ``frequency`` and ``reap`` need a selection); ``None`` streams when the in-memory
        export would not fit in the memory available now.
    heal_steps, heal_lr : distil the proxy toward the original for this many steps first
        (:func:`moescope.healing.heal`: only router rows and kept experts train).
    fidelity : measure fidelity and run the validity checklist on the proxy (``True``, or the
        options of :func:`moescope.fidelity.measure_fidelity`), recorded in the manifest.
        A streaming export never holds the models in memory, so it measures nothing.
    tasks : the tasks of the accuracy that healing and fidelity report, and that the checklist's
        task capability compares: ``None`` (the task suite for the toy, none otherwise),
        ``"toy"``, family names, or a ``.jsonl`` of ``{"prompt", "answer"}`` lines, read before
        the model loads. Needs the model in memory, with its tokenizer.
    """
    from moescope.loading import load_model, resolve_model

    source = resolve_model(model)
    check_output_dir(out, overwrite=overwrite)  # fail in seconds, before loading anything
    named_tasks = check_task_spec(tasks)  # a bad prompt file fails before anything loads
    if heal_steps < 0:
        raise MoescopeError(f"heal_steps={heal_steps} must be 0 (no healing) or a positive number of steps.")
    if streaming is None:
        from moescope.streaming import needs_streaming

        streaming = needs_streaming(source, keep=keep, selection=selection)
    if streaming:
        from moescope.streaming import export_streaming

        if heal_steps:
            raise _needs_memory(
                "healing", "heal the streamed proxy later with moescope.healing.heal_proxy_dir"
            )
        if named_tasks is not None:
            raise _needs_memory(
                "task accuracy",
                "measure the streamed proxy later with moescope.fidelity.measure_fidelity(..., tasks=...)",
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
    from moescope.streaming import write_selected

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
        from moescope.healing import heal

        healing = heal(
            lm, proxy, data, tokenizer=tokenizer, steps=heal_steps, lr=heal_lr, seed=seed, tasks=tasks
        )
    if not fidelity:
        return {"fidelity": None, "checklist": None, "healing": healing}
    from moescope.fidelity import measure_fidelity, validity_checklist

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
    from moescope.fidelity import manifest_sections

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
        from moescope.routing import collect_routing

        data = _data_for(lm, tokenizer, calibration, seed)
        stats = collect_routing(
            lm, data, tokenizer=tokenizer, n_tokens=n_tokens, seed=seed, progress=progress
        )
    if method == "cluster":
        from moescope.embeddings import embed_experts

        embeddings = embed_experts(lm, "multiview", stats=stats, seed=seed, progress=progress)
    return select_experts(
        lm, keep, method=method, embeddings=embeddings, stats=stats, seed=seed, allow_top_k=allow_top_k
    )


def given_selection(moe: MoEModel, selection: Selection | str | Path, keep: Any = None) -> Selection:
    """A selection (or its file) checked to belong to this model and to agree with ``keep``."""
    chosen = selection if isinstance(selection, Selection) else Selection.load(selection)
    chosen.check_model(moe.config)
    if keep is not None:
        wanted = parse_keep(keep, moe.num_experts, moe.top_k, chosen.n_group, allow_top_k=True)
        if wanted != chosen.keep:
            raise MoescopeError(
                f"--keep asks for {wanted} experts per layer but the selection keeps {chosen.keep}; "
                "drop --keep or make a new selection."
            )
    return chosen


def kept_count(moe: MoEModel, keep: str | float | int | None, allow_top_k: bool = False) -> int:
    """Experts kept per layer, refused early when the model's routing does not allow it."""
    if keep is None:
        raise MoescopeError("say how many experts to keep: --keep 0.25, --keep 1/4 or --keep 8.")
    rule = moe.rule
    return parse_keep(
        keep, moe.num_experts, moe.top_k, rule.n_group, allow_top_k=allow_top_k, topk_group=rule.topk_group
    )


def copy_side_files(source: Path, out: Path) -> list[str]:
    """Copy tokenizer, chat-template and other non-weight files the proxy needs unchanged."""
    copied = []
    for file in sorted(source.iterdir()):
        wanted = file.is_file() and file.name not in _NOT_COPIED and not file.name.endswith(_WEIGHT_SUFFIXES)
        if wanted and not (out / file.name).exists():  # save_pretrained already wrote generation_config
            shutil.copy2(file, out / file.name)
            copied.append(file.name)
    return copied


def make_manifest(
    source: Path,
    model: PreTrainedModel,
    proxy: PreTrainedModel | PretrainedConfig,
    selection: Selection,
) -> dict[str, Any]:
    """``moescope.json``: how the proxy was made, in original expert indices (``proxy``: the
    proxy model or its config)."""
    moe = adapt(model)
    cut_config = getattr(proxy, "config", proxy)
    return {
        "kind": MANIFEST_KIND,
        "schema_version": SCHEMA_VERSION,
        "moescope_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "source": {
            "path": str(source),
            "model_type": model.config.model_type,
            "config_hash": config_hash(model.config),
            "num_experts": moe.num_experts,
        },
        "proxy": {
            "config_hash": config_hash(cut_config),
            "num_experts": selection.keep,
            "count_key": moe.spec.count_key,
            "top_k": moe.top_k,
            "n_group": moe.rule.n_group,
            "topk_group": moe.rule.topk_group,
            "weight_semantics": weight_semantics(moe.rule),
        },
        "method": selection.method,
        "view": selection.view,
        "keep": selection.keep,
        "keep_ratio": selection.keep_ratio,
        "seed": selection.seed,
        "loop_times": loop_times_of(model.config),
        "layers": [
            {"layer": entry.layer, "kept": list(entry.kept), "labels": list(entry.labels)}
            for entry in selection.layers
        ],
        "selection": json.loads(selection.to_json()),
        "versions": library_versions(),
    }


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    return path


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    """The proxy manifest of a checkpoint directory, or ``None`` for a model that is no proxy."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise MoescopeError(f"{path} is not valid JSON ({err}); export the proxy again.") from None
    if data.get("kind") != MANIFEST_KIND:
        raise MoescopeError(f"{path} is not a moescope proxy manifest; export the proxy again.")
    return data
