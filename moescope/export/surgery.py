"""Proxy surgery: keep the selected routed experts of every MoE layer, leave the rest bit-identical.

A proxy is the source checkpoint with, in every MoE layer, only the kept routed experts: their
expert tensors, their router rows, router-bias entries and correction-bias entries. Attention,
norms, embeddings, shared experts, dense layers and the LM head are copied unchanged; the
config's expert count is rewritten under the architecture's own key; top-k and grouped
routing are left as they are (the selection guarantees they stay valid). The result is a
plain Hugging Face directory that ``AutoModelForCausalLM.from_pretrained`` loads with no
moescope code, plus ``moescope.json``, the manifest that says how it was made. A multimodal
checkpoint (Llama 4, Qwen3.5-MoE, Qwen4-Exp) is read through its language model; its proxy is the whole
checkpoint, written by cutting the shards (:func:`moescope.export.streaming.export.write_selected`), so the
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

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from moescope.errors import MoescopeError
from moescope.explore.selection import Selection
from moescope.keep import parse_keep
from moescope.models.arch import MoEModel, adapt, set_config_value, take_experts
from moescope.models.routers import RoutingRule

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
