"""The proxy validity checklist: the three model-side properties a proxy keeps, each pass/fail.

- **backbone identical** (:data:`BACKBONE`): every config field but the expert count and the
  routing fields (judged by the next check) and what transformers adds at run time; the class
  of every module; and every tensor that is not per-expert (attention, norms, embeddings, LM
  head, shared experts, dense layers, rotary buffers) by name, shape, dtype and bytes.
- **routing mechanism identical** (:data:`ROUTING`): the same MoE layers; the same routing rule
  but for the count (top-k, scoring, normalization, scale, groups, bias use; see
  :class:`~moescope.models.routers.RoutingRule`); the same block, router and experts classes and the
  same plain settings on them (an expert count excepted); the same biases, shaped one entry per
  kept expert, the selection-only correction bias equal to the original's entries of the kept
  experts (the router bias trains with the router rows, so only its presence and layout count);
  shared experts bit-identical.
- **task capability retained** (:data:`CAPABILITY`): proxy accuracy / original accuracy at
  least ``accuracy_threshold``, as a ratio of means over the tasks whose original accuracy is
  in the RL window :data:`WINDOW` (all tasks when none is); sampled accuracy where measured
  (what an RL rollout sees), greedy otherwise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moescope.errors import MoescopeError
from moescope.export.fidelity import CAPABILITY_THRESHOLD
from moescope.export.fidelity.records import Check
from moescope.export.manifest import read_manifest
from moescope.export.surgery import expert_state_keys, weight_semantics
from moescope.models.resident import read_when_used, resident
from moescope.models.routers import RoutingRule, describe
from moescope.models.view import MoELayer, MoEModel, adapt, decoder_layers
from moescope.provenance import config_hash

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedModel

    from moescope.explore.selection import Selection
    from moescope.export.fidelity.records import Fidelity

BACKBONE = "backbone identical"
ROUTING = "routing mechanism identical"
CAPABILITY = "task capability retained"
WINDOW = (0.3, 0.9)
"""Original accuracies inside this range leave RL groups with mixed rewards: the tasks that matter."""

# Config fields transformers adds or that say how a model is run, not what it is.
_RUNTIME = {
    "transformers_version",
    "name_or_path",
    "output_router_logits",
    "use_cache",
    "return_dict",
    "output_hidden_states",
    "output_attentions",
}
_SHOWN = 3  # differences named in a figure; the details hold them all


def checklist_frame(checks: list[Check]) -> pd.DataFrame:
    """One row per check: ``check, passed, figure`` (for a notebook table)."""
    import pandas as pd

    return pd.DataFrame([(c.name, c.passed, c.figure) for c in checks], columns=["check", "passed", "figure"])


def validity_checklist(
    original: PreTrainedModel,
    proxy: PreTrainedModel,
    fidelity: Fidelity | None = None,
    *,
    accuracy_threshold: float = CAPABILITY_THRESHOLD,
    selection: Selection | None = None,
) -> list[Check]:
    """The three properties, in order: backbone, routing mechanism, task capability.

    ``fidelity`` supplies the task accuracy; without it (or without tasks in it) the capability
    check fails as "not measured". ``selection`` names the kept experts where neither the
    proxy's manifest nor its router rows tell (a healed in-memory proxy of a model with a
    correction bias).

    Example
    -------
    >>> from moescope.models.zoo import tiny
    >>> from moescope.explore.clustering import select_experts
    >>> from moescope.export.surgery import build_proxy
    >>> model = tiny("mixtral")
    >>> checks = validity_checklist(model, build_proxy(model, select_experts(model, "1/2", method="random")))
    >>> [c.passed for c in checks]
    [True, True, False]
    """
    omoe, pmoe = adapt(original), adapt(proxy)
    return [
        backbone_check(omoe, pmoe),
        routing_check(omoe, pmoe, selection),
        capability_check(fidelity, accuracy_threshold),
    ]


# --- which original experts the proxy keeps --------------------------------------------------------


def kept_experts(
    original: PreTrainedModel, proxy: PreTrainedModel, selection: Selection | None = None
) -> dict[int, tuple[int, ...]]:
    """MoE layer → original ids of the proxy's experts, in proxy order.

    From ``selection``, else the manifest of the directory the proxy was loaded from (when it
    names this original), else by finding each proxy router row among the original's (exact
    bytes); a proxy keeping every expert keeps them in order.
    """
    omoe, pmoe = adapt(original), adapt(proxy)
    if selection is not None:
        selection.check_model(original.config)
        kept = {entry.layer: tuple(entry.kept) for entry in selection.layers}
    elif pmoe.num_experts == omoe.num_experts:
        kept = {index: tuple(range(omoe.num_experts)) for index in omoe.moe_indices}
    else:
        kept = _kept_from_manifest(original, proxy) or _kept_from_router_rows(omoe, pmoe)
    if sorted(kept) != pmoe.moe_indices or any(len(ids) != pmoe.num_experts for ids in kept.values()):
        raise MoescopeError(
            f"the kept experts given ({ {k: len(v) for k, v in kept.items()} } per layer) do not fit "
            f"this proxy ({pmoe.num_experts} experts in layers {pmoe.moe_indices}); pass the proxy's own "
            "selection."
        )
    return kept


def _kept_from_manifest(
    original: PreTrainedModel, proxy: PreTrainedModel
) -> dict[int, tuple[int, ...]] | None:
    where = getattr(proxy, "name_or_path", "") or ""
    if not where or not Path(where).is_dir():
        return None
    manifest = read_manifest(where)
    if manifest is None or manifest["source"].get("config_hash") != config_hash(original.config):
        return None
    return {entry["layer"]: tuple(entry["kept"]) for entry in manifest["layers"]}


def _kept_from_router_rows(omoe: MoEModel, pmoe: MoEModel) -> dict[int, tuple[int, ...]]:
    kept = {}
    for layer in pmoe.layers:
        rows = {tensor_bytes(row): i for i, row in enumerate(omoe.layer(layer.index).router_weight)}
        found = [rows.get(tensor_bytes(row)) for row in layer.router_weight]
        if None in found:
            raise MoescopeError(
                f"cannot tell which original experts layer {layer.index} of the proxy keeps (its router "
                "rows are not the original's, e.g. after healing); pass selection= or load the proxy "
                "from its exported directory."
            )
        kept[layer.index] = tuple(found)
    return kept


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of a tensor: equal bytes are bit-identical values, NaN payloads included."""
    return _bits(tensor).numpy().tobytes()


def bit_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one shape and dtype hold the same bits (NaN payloads included),
    compared in place: no copy of either (a vocabulary matrix copied to bytes took as much
    memory again, at the peak of a layer-sequential export's checklist)."""
    return torch.equal(_bits(a), _bits(b))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat ``uint8`` view (a copy only where it is not contiguous)."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


# --- backbone --------------------------------------------------------------------------------------


def backbone_check(omoe: MoEModel, pmoe: MoEModel) -> Check:
    """Config (but the expert count and routing fields), module classes and every non-expert tensor."""
    routing = routing_keys(omoe)
    config = _config_differences(omoe.model.config, pmoe.model.config, routing)
    modules = _module_differences(omoe.model, pmoe.model)
    tensors, compared = _backbone_differences(omoe, pmoe)
    count = f"{omoe.spec.count_key} {omoe.num_experts} → {pmoe.num_experts}"
    if config or modules or tensors:
        parts = (
            [f"{len(tensors)} of {compared} backbone tensors differ: {_listing(tensors)}"] if tensors else []
        )
        parts += [f"config differs in {_listing(config)}"] if config else []
        parts += [f"module classes differ: {_listing(modules)}"] if modules else []
        figure = "; ".join(parts)
    else:
        figure = f"{compared} backbone tensors bit-identical; config identical but for {count}"
    details = {
        "tensors_compared": compared,
        "tensors_differing": tensors,
        "config_differing": config,
        "modules_differing": modules,
        "expert_count": {"key": omoe.spec.count_key, "original": omoe.num_experts, "proxy": pmoe.num_experts},
        "routing_keys": sorted(routing),
    }
    return Check(BACKBONE, not (config or modules or tensors), figure, details)


class _KeyRecorder:
    """Stands in for a config and records which fields are read, a sub-config's by dotted name
    (``ffn_config.moe_top_k``)."""

    def __init__(self, config: Any, read: set[str] | None = None, prefix: str = "") -> None:
        self.config, self.read, self.prefix = config, set() if read is None else read, prefix

    def __getattr__(self, name: str) -> Any:
        from transformers import PretrainedConfig

        value = getattr(self.config, name)
        if isinstance(value, PretrainedConfig):
            return _KeyRecorder(value, self.read, f"{self.prefix}{name}.")
        self.read.add(self.prefix + name)
        return value


def routing_keys(moe: MoEModel) -> set[str]:
    """Config fields that decide routing: the count, top-k and what the routing rule reads."""
    recorder = _KeyRecorder(moe.config)
    moe.spec.rule(recorder)
    return recorder.read | {moe.spec.count_key, moe.spec.topk_key}


def _config_differences(a: Any, b: Any, skip: set[str]) -> dict[str, str]:
    first, second = _flat(a.to_dict()), _flat(b.to_dict())
    out = {}
    for key in sorted(first.keys() | second.keys()):
        name = key.rpartition(".")[2]
        if key in skip or name in _RUNTIME or name.startswith("_"):
            continue
        if first.get(key, "absent") != second.get(key, "absent"):
            out[key] = f"{first.get(key, 'absent')!r} → {second.get(key, 'absent')!r}"
    return out


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config dict with its sub-configs' fields under dotted keys (``ffn_config.moe_top_k``)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and "model_type" in value:  # a sub-config, not a plain dict field
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _module_differences(a: torch.nn.Module, b: torch.nn.Module) -> dict[str, str]:
    first = {name: type(m).__name__ for name, m in a.named_modules()}
    second = {name: type(m).__name__ for name, m in b.named_modules()}
    return {
        name or "<model>": f"{first.get(name, 'absent')} → {second.get(name, 'absent')}"
        for name in sorted(first.keys() | second.keys())
        if first.get(name) != second.get(name)
    }


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every state-dict tensor, plus the buffers a state dict leaves out (rotary frequencies)."""
    state = model.state_dict()
    for name, buffer in model.named_buffers():
        state.setdefault(name, buffer)
    return state


def _backbone_differences(omoe: MoEModel, pmoe: MoEModel) -> tuple[dict[str, str], int]:
    """:func:`tensor_differences` of the two backbones, and how many tensors were compared; a
    layer-sequential model's tensors (the original's, or a proxy's read from its cut) are read a
    decoder layer at a time (then the embeddings of both, then their LM heads), each once, and
    only that layer's names are gathered while it is held."""
    ours, listed = backbone_tensors(omoe), backbone_tensors(pmoe)  # names (a layer's may be unread)
    names = set(ours)
    model, experts = omoe.model, set(expert_state_keys(omoe))
    prefixes = {id(m): f"{n}." for n, m in model.named_modules()}
    layers = [(layer, prefixes[id(layer)]) for layer in decoder_layers(model)]
    inside = tuple(prefix for _, prefix in layers)
    proxy_modules = dict(pmoe.model.named_modules())
    differences: dict[str, str] = {}

    def compare(part: dict[str, torch.Tensor], proxy: dict[str, torch.Tensor]) -> None:
        differences.update(tensor_differences(part, {n: proxy[n] for n in part if n in proxy}))

    for layer, prefix in layers:
        proxy_layer = proxy_modules.get(prefix[:-1])
        with (
            _layer_tensors(model, layer, prefix, experts) as tensors,
            _layer_tensors(pmoe.model, proxy_layer, prefix, experts) as theirs,
        ):
            compare(tensors, theirs)
    vocabulary = list(zip(_vocabulary(model), _vocabulary(pmoe.model), strict=True))
    for module, proxy_module in vocabulary:  # one vocabulary-sized matrix of each model at a time
        prefix = prefixes[id(module)]
        with resident(module), resident(proxy_module):
            compare(_named_tensors(module, prefix), _named_tensors(proxy_module, prefix))
    read = inside + tuple(prefixes[id(module)] for module, _ in vocabulary)
    compare({n: t for n, t in ours.items() if not n.startswith(read)}, listed)  # held throughout
    differences |= tensor_differences({}, {n: listed[n] for n in listed.keys() - names})
    return dict(sorted(differences.items())), len(names | listed.keys())


@contextmanager
def _layer_tensors(
    model: torch.nn.Module, layer: torch.nn.Module | None, prefix: str, leave_out: Container[str]
) -> Iterator[dict[str, torch.Tensor]]:
    """The tensors of ``layer`` (under their names in ``model``) but those in ``leave_out``, for
    the ``with`` block. A layer a layer-sequential model reads when used is read from its shards
    without them, not loaded whole by its hook: the backbone check leaves out the experts, most
    of a MoE layer's bytes, and held the original's whole layer beside the proxy's at the peak
    of a layer-sequential export."""
    if layer is None:
        yield {}
        return
    weights = getattr(model, "_layer_weights", None)
    if read_when_used(layer) and weights is not None and prefix in weights.layers:
        held = {n: t for n, t in _named_tensors(layer, prefix).items() if t.device.type != "meta"}
        yield {n: t for n, t in held.items() if n not in leave_out} | weights.read(prefix, leave_out)
        return
    with resident(layer):
        yield {n: t for n, t in _named_tensors(layer, prefix).items() if n not in leave_out}


def _named_tensors(module: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """:func:`model_tensors` of ``module`` under their names in the model (``prefix``: its own)."""
    return {prefix + n: t for n, t in model_tensors(module).items()}


def _vocabulary(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The input embeddings and the LM head (read when used in a layer-sequential model)."""
    return [m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None]


def backbone_tensors(moe: MoEModel) -> dict[str, torch.Tensor]:
    """Every tensor of the model that holds no per-expert slice (see :func:`model_tensors`)."""
    experts = expert_state_keys(moe)
    return {name: tensor for name, tensor in model_tensors(moe.model).items() if name not in experts}


def tensor_differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, str]:
    """Name → how the second tensor differs from the first, for every tensor that is not bit-identical."""
    out = {}
    for name in sorted(a.keys() | b.keys()):
        reason = _tensor_difference(a.get(name), b.get(name))
        if reason:
            out[name] = reason
    return out


def _tensor_difference(a: torch.Tensor | None, b: torch.Tensor | None) -> str | None:
    if a is None or b is None:
        return "missing from the proxy" if b is None else "only in the proxy"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} → {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} → {b.dtype}"
    if bit_identical(a, b):
        return None
    changed = int((a.detach().cpu() != b.detach().cpu()).sum())
    return f"values differ in {changed} of {a.numel()} elements"


def _listing(found: dict[str, str]) -> str:
    shown = [f"{name} ({reason})" for name, reason in list(found.items())[:_SHOWN]]
    more = len(found) - _SHOWN
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


# --- routing mechanism -----------------------------------------------------------------------------


def routing_check(omoe: MoEModel, pmoe: MoEModel, selection: Selection | None = None) -> Check:
    """Same MoE layers, rule, classes and settings, biases and shared experts."""
    found: dict[str, list[int]] = {}  # problem → MoE layers it was found in
    if omoe.moe_indices != pmoe.moe_indices:
        found[f"MoE layers {omoe.moe_indices} → {pmoe.moe_indices}"] = []
    for problem in _rule_differences(omoe.rule, pmoe.rule):
        found[problem] = []
    kept = functools.cache(lambda: kept_experts(omoe.model, pmoe.model, selection))
    stack, proxy_stack = decoder_layers(omoe.model), decoder_layers(pmoe.model)
    for layer in pmoe.layers:
        if layer.index not in omoe.moe_indices:
            continue
        # a layer-sequential original (or proxy): this layer read once
        with resident(stack[layer.index]), resident(proxy_stack[layer.index]):
            original = omoe.layer(layer.index)
            problems = _module_settings(original, layer, omoe.num_experts, pmoe.num_experts)
            problems += _shared(original, layer) + _bias_problems(original, layer, pmoe.num_experts, kept)
        for problem in problems:
            found.setdefault(problem, []).append(layer.index)
    problems = {p: (f"layers {layers}" if layers else "model") for p, layers in found.items()}
    shared = sum(layer.shared_experts is not None for layer in pmoe.layers)
    if problems:
        figure = f"{len(problems)} difference(s): " + "; ".join(
            f"{p} ({where})" for p, where in list(problems.items())[:_SHOWN]
        )
    else:
        figure = (
            f"{describe(pmoe.rule)} in {len(pmoe.layers)} MoE layers, router "
            f"{type(pmoe.layers[0].router).__name__}; {_bias_summary(pmoe)}; "
            f"shared experts {'bit-identical in ' + str(shared) + ' layers' if shared else 'none'}"
        )
    details = {
        "problems": problems,
        "rule": {f.name: getattr(pmoe.rule, f.name) for f in fields(RoutingRule)},
        "weight_semantics": weight_semantics(pmoe.rule),
    }
    return Check(ROUTING, not problems, figure, details)


def _rule_differences(a: RoutingRule, b: RoutingRule) -> list[str]:
    out = []
    for f in fields(RoutingRule):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            out.append(f"{f.name} {x!r} → {y!r}")
    return out


def _settings(module: torch.nn.Module) -> dict[str, Any]:
    """Plain (bool, int, float, str) attributes: top-k, normalization flags, sizes."""
    return {
        key: value
        for key, value in vars(module).items()
        if not key.startswith("_") and key != "training" and isinstance(value, bool | int | float | str)
    }


def _module_settings(original: MoELayer, proxy: MoELayer, n_original: int, n_proxy: int) -> list[str]:
    out = []
    for role in ("block", "router", "experts"):
        a, b = getattr(original, role), getattr(proxy, role)
        if type(a) is not type(b):
            out.append(f"{role} class {type(a).__name__} → {type(b).__name__}")
            continue
        first, second = _settings(a), _settings(b)
        for key in sorted(first.keys() | second.keys()):
            x, y = first.get(key), second.get(key)
            if x != y and (x, y) != (n_original, n_proxy):  # the expert count may differ
                out.append(f"{role}.{key} {x!r} → {y!r}")
    return out


def _shared(original: MoELayer, proxy: MoELayer) -> list[str]:
    out = []
    for role in ("shared_experts", "shared_gate"):
        a, b = getattr(original, role), getattr(proxy, role)
        if (a is None) != (b is None):
            out.append(
                f"{role} {'absent' if a is None else 'present'} → {'absent' if b is None else 'present'}"
            )
        elif a is not None:
            differing = tensor_differences(_module_tensors(a), _module_tensors(b))
            out += [f"{role}.{name} {reason}" for name, reason in differing.items()]
    return out


def _module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _bias_problems(
    original: MoELayer, layer: MoELayer, count: int, kept: Callable[[], dict[int, tuple[int, ...]]]
) -> list[str]:
    """What is wrong with one proxy layer's biases (``kept``: the kept experts, found on first use)."""
    problems = []
    for role in ("router_bias", "correction_bias"):
        a, b = getattr(original, role), getattr(layer, role)
        if (a is None) != (b is None):
            problem = (
                f"{role} {'absent' if a is None else 'present'} → {'absent' if b is None else 'present'}"
            )
        elif a is None:
            continue
        elif b.shape != (count,) or b.dtype != a.dtype:
            problem = f"{role} {b.dtype} {tuple(b.shape)}, not {a.dtype} ({count},)"
        elif role == "router_bias":
            continue  # trained with the router rows by healing; its layout is what counts
        else:
            try:
                index = torch.tensor(kept()[layer.index], device=a.device)
            except MoescopeError:
                problem = f"{role} not verified: the kept experts are unknown, pass selection="
            else:
                if tensor_bytes(a.index_select(0, index)) == tensor_bytes(b):
                    continue
                problem = f"{role} is not the original's entries of the kept experts"
        problems.append(problem)
    return problems


def _bias_summary(moe: MoEModel) -> str:
    layer = moe.layers[0]
    names = [role for role in ("router_bias", "correction_bias") if getattr(layer, role) is not None]
    return f"{' and '.join(names)} sliced to {moe.num_experts} experts" if names else "no router biases"


# --- task capability -------------------------------------------------------------------------------


def capability_check(fidelity: Fidelity | None, threshold: float = CAPABILITY_THRESHOLD) -> Check:
    """Proxy / original accuracy, a ratio of means over the in-window tasks (see the module docstring)."""
    frame = None if fidelity is None else fidelity.task_accuracy
    if frame is None or frame.empty:
        return Check(
            CAPABILITY,
            False,
            'not measured: no tasks for this model; give a .jsonl of {"prompt", "answer"} lines '
            "(moescope export --prompts FILE, or tasks= in Python)",
            {"measured": False, "threshold": threshold},
        )
    return capability_of(frame, threshold)


def capability_rows(frame: pd.DataFrame) -> tuple[str, pd.DataFrame, bool]:
    """The rows of a task-accuracy frame (a :class:`Fidelity`'s ``task_accuracy``) that the
    capability check compares: ``(mode, rows, in_window)``; sampled where measured, the tasks
    whose original accuracy is in :data:`WINDOW`, all tasks when none is."""
    mode = "sampled" if (frame["mode"] == "sampled").any() else "greedy"
    rows = frame[frame["mode"] == mode]
    window = rows[rows["original"].between(*WINDOW)]
    return mode, (window if len(window) else rows), bool(len(window))


def capability_of(frame: pd.DataFrame, threshold: float = CAPABILITY_THRESHOLD) -> Check:
    """The capability check of a non-empty task-accuracy frame (``task, mode, original, proxy``)."""
    mode, used, in_window = capability_rows(frame)
    original, proxy = float(used["original"].mean()), float(used["proxy"].mean())
    ratio = proxy / original if original > 0 else math.nan
    passed = bool(ratio >= threshold)
    scope = f"in-window tasks {list(used['task'])}" if in_window else "all tasks (none in the window)"
    sides = ", ".join(f"{r.task} {r.original:.2f} → {r.proxy:.2f}" for r in used.itertuples())
    figure = (
        f"accuracy ratio {ratio:.2f} {'≥' if passed else '<'} {threshold:g} ({mode}; {sides})"
        if original > 0
        else f"not measurable: the original solves none of the tasks ({mode}; {sides})"
    )
    details = {
        "measured": True,
        "ratio": ratio,
        "threshold": threshold,
        "mode": mode,
        "scope": scope,
        "window": list(WINDOW),
        "tasks": list(used["task"]),
        "original": original,
        "proxy": proxy,
    }
    return Check(CAPABILITY, passed, figure, details)
