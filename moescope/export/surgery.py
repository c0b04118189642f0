"""Proxy surgery: keep the selected routed experts of every MoE layer, leave the rest bit-identical.

A proxy is the source checkpoint with, in every MoE layer, only the kept routed experts: their
expert tensors, their router rows, router-bias entries and correction-bias entries. Attention,
norms, embeddings, shared experts, dense layers and the LM head are copied unchanged; the
config's expert count is rewritten under the architecture's own key; top-k and grouped
routing are left as they are (the selection guarantees they stay valid). The result is a
plain Hugging Face directory that ``AutoModelForCausalLM.from_pretrained`` loads with no
moescope code, plus ``moescope.json``, the manifest that says how it was made. A multimodal
checkpoint whose language model is supported is read through that language model
(:func:`~moescope.models.support.language_config`); its proxy is the whole checkpoint, written by
cutting the shards (:func:`moescope.export.streaming.export.write_selected`), so the vision
tower and projector, which the loaded language model does not hold, are copied too.

Expert ``j`` of a proxy layer is the ``j``-th kept original expert (kept ids are sorted, so the
original order is kept); the manifest maps proxy experts back to original indices.

Routing on the proxy (what "exact" means)
-----------------------------------------
For a token whose original top-k experts were all kept (and, under grouped routing, whose
chosen groups stay chosen), the proxy chooses the same experts. Their weights are:

* **identical** when the weights depend only on the chosen experts: a softmax whose chosen
  probabilities are renormalized (``normalize``; a division by their p-norm cancels any common
  scale too), sigmoid scores (each expert's own, with or without renormalization, on soft-capped
  logits or not), and a softmax or sigmoid over the chosen logits (``scoring="logits"``);
* **scaled by 1 / P_kept** when the weights are softmax probabilities over all experts without
  renormalization (``scoring="softmax"``, ``normalize=False``): the softmax runs over the kept
  experts only, so each chosen weight is divided by the probability mass ``P_kept`` the kept
  experts had in the original;
* **changed** for the sparsemixer (``scoring="sparsemixer"``), whose weights are a softmax over
  the experts near the best one, some of which may be gone.

A rule that adds its correction bias to softmax probabilities to choose (``bias_for_selection``
with softmax scoring) can also change a choice when the kept probabilities grow.
:func:`weight_semantics` names the case of one rule; :func:`weight_semantics_by_architecture`
lists the supported architectures under each case, read from the architecture table (one whose
case hangs on a config switch, such as ``norm_topk_prob``, under each setting).
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch

from moescope.errors import MoescopeError
from moescope.explore.selection import Selection
from moescope.keep import Keep
from moescope.models.routers import RoutingRule
from moescope.models.rules import NORMALIZE_SWITCHES
from moescope.models.table import ARCHITECTURES, ArchSpec, config_value, set_config_value
from moescope.models.view import MoEModel, adapt, take_experts

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

WeightSemantics = Literal["identical", "scaled", "changed"]


def weight_semantics(rule: RoutingRule) -> WeightSemantics:
    """How the proxy's routing weights relate to the original's for an unchanged choice."""
    if rule.scoring == "sparsemixer":
        return "changed"
    if rule.scoring == "softmax" and not rule.normalize:
        return "scaled"
    return "identical"


def weight_semantics_by_architecture() -> dict[str, list[str]]:
    """Every supported architecture under the :func:`weight_semantics` its routing rule gives.

    Read from the architecture table with each config's published defaults, so the list cannot
    drift from the rules; an architecture whose case hangs on a config switch
    (``NORMALIZE_SWITCHES``) is listed under each setting, as ``"name with key: value"``.

    Examples
    --------
    >>> by_case = weight_semantics_by_architecture()
    >>> by_case["changed"], by_case["scaled"][0]
    (['PhiMoE'], 'Qwen2-MoE with norm_topk_prob: false')
    """
    out: dict[str, list[str]] = {case: [] for case in get_args(WeightSemantics)}
    for spec in ARCHITECTURES.values():
        for case, label in _semantics_of(spec):
            out[case].append(label)
    return out


def _semantics_of(spec: ArchSpec) -> list[tuple[WeightSemantics, str]]:
    """``(case, label)`` of one architecture: its name alone, or one entry per setting of the
    first switch its config has that changes the case."""
    from transformers import AutoConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.for_model(spec.model_type)
    for key, values in NORMALIZE_SWITCHES.items():
        if not _has_key(config, key):
            continue
        found = [
            (
                weight_semantics(spec.rule(_with_value(config, key, v))),
                f"{spec.name} with {key}: {json.dumps(v)}",
            )
            for v in values
        ]
        if len({case for case, _ in found}) > 1:
            return found
    return [(weight_semantics(spec.rule(config)), spec.name)]


def _has_key(config: PretrainedConfig, key: str) -> bool:
    try:
        config_value(config, key)
    except (AttributeError, KeyError):
        return False
    return True


def _with_value(config: PretrainedConfig, key: str, value: Any) -> PretrainedConfig:
    """A copy of ``config`` with the field at a dotted ``key`` set to ``value``."""
    config = copy.deepcopy(config)
    set_config_value(config, key, value)
    return config


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


def given_selection(moe: MoEModel, selection: Selection | str | Path, keep: Any = None) -> Selection:
    """A selection (or its file) checked to belong to this model and to agree with ``keep``."""
    chosen = selection if isinstance(selection, Selection) else Selection.load(selection)
    chosen.check_model(moe.config)
    if keep is not None:
        wanted = chosen.keep_of(keep).fixed()
        if wanted != chosen.keep:
            raise MoescopeError(
                f"--keep asks for {wanted} experts per layer but the selection keeps {chosen.keep}; "
                "drop --keep or make a new selection."
            )
    return chosen


def keep_of(
    model: MoEModel | PretrainedConfig,
    keep: str | float | int | Keep | None,
    *,
    allow_top_k: bool = False,
    allow_auto: bool = False,
) -> Keep:
    """``keep`` parsed once against a model's routing (experts, top-k, groups), read from the
    model or from its config alone (a checkpoint's, before anything loads), refused in one
    sentence when the routing does not allow it; ``"auto"`` with ``allow_auto``."""
    if keep is None:
        raise MoescopeError("say how many experts to keep: --keep 0.25, --keep 1/4 or --keep 8.")
    if isinstance(model, MoEModel):
        experts, top_k, rule = model.num_experts, model.top_k, model.rule
    else:
        from moescope.models.support import language_config, spec_for

        config = language_config(model)
        spec = spec_for(config)
        experts, rule = spec.num_experts(config), spec.rule(config)
        top_k = rule.top_k
    options = {"allow_top_k": allow_top_k, "topk_group": rule.topk_group, "allow_auto": allow_auto}
    return Keep.parse(keep, experts, top_k, rule.n_group, **options)


def kept_count(moe: MoEModel, keep: str | float | int | Keep | None, allow_top_k: bool = False) -> int:
    """Experts kept per layer, refused early when the model's routing does not allow it."""
    return keep_of(moe, keep, allow_top_k=allow_top_k).fixed()
