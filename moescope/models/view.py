"""The uniform view: any supported MoE model read as layers of routers and experts.

:func:`adapt` reads a loaded model through its architecture row (:mod:`moescope.models.table`)
and gives one view (:class:`MoEModel` → :class:`MoELayer` → :class:`ExpertWeights`), so routing
statistics, clustering, export and replay never special-case an architecture.

Facts behind the view (transformers 5.x): experts are fused 3-D parameters in memory —
``gate_up_proj [E, 2I, H]`` (gate rows first) and ``down_proj [E, H, I]`` for most models;
GPT-OSS stores them transposed with gate/up *interleaved* on the last axis plus per-expert
biases; Llama 4 stores them transposed and concatenated; DBRX keeps 2-D ``w1``, ``v1``, ``w2``
``[E·I, H]``, one block of ``I`` rows per expert, and its expert settings in ``ffn_config``.

Examples
--------
>>> from moescope.models.zoo import tiny
>>> moe = adapt(tiny("mixtral"))
>>> moe.num_experts, moe.top_k, [layer.index for layer in moe.layers]
(8, 2, [0, 1])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from moescope.errors import MoescopeError, UnsupportedArchitectureError
from moescope.models.routers import RoutingRule, cap_logits, route
from moescope.models.support import spec_for
from moescope.models.table import ArchSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class ExpertWeights:
    """One routed expert in the Linear convention (``out × in``), whatever the storage.

    ``gate`` and ``up`` are ``(I, H)``, ``down`` is ``(H, I)``; biases are ``None`` unless the
    architecture has them, and ``gate`` is ``None`` for experts without one (Nemotron-H's
    ``down(act(up x))``). Tensors are views of the model's parameters (no copy).
    """

    gate: torch.Tensor | None
    up: torch.Tensor
    down: torch.Tensor
    gate_bias: torch.Tensor | None = None
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None

    def flat(self) -> torch.Tensor:
        """All weights of the expert as one vector (gate, up, down, then biases)."""
        parts = [self.gate, self.up, self.down, self.gate_bias, self.up_bias, self.down_bias]
        return torch.cat([p.reshape(-1) for p in parts if p is not None])


def expert_axis(tensor: torch.Tensor, num_experts: int) -> int:
    """The axis holding one slice per expert: the first (fused weights, router rows), the last
    (correction biases stored ``[E]`` or ``[1, E]``), or the first again when it holds one block
    of rows per expert (DBRX's ``[E·I, H]``)."""
    if tensor.shape[0] == num_experts:
        return 0
    if tensor.shape[-1] == num_experts:
        return tensor.dim() - 1
    if tensor.dim() > 1 and tensor.shape[0] % num_experts == 0:
        return 0
    raise MoescopeError(f"a tensor of shape {tuple(tensor.shape)} has no axis of {num_experts} experts.")


def experts_first(tensor: torch.Tensor, num_experts: int) -> torch.Tensor:
    """A view of ``tensor`` indexed by expert first: ``[E, block, ...]`` along its expert axis."""
    axis = expert_axis(tensor, num_experts)
    return tensor.unflatten(axis, (num_experts, -1)).movedim(axis, 0)


def take_experts(tensor: torch.Tensor, kept: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``tensor`` with only the ``kept`` experts' slices (or blocks of rows), in its own layout."""
    axis = expert_axis(tensor, num_experts)
    return tensor.unflatten(axis, (num_experts, -1)).index_select(axis, kept).flatten(axis, axis + 1)


def _get(root: nn.Module, path: str) -> Any:
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _find(layer: nn.Module, block: nn.Module, path: str | None, *, optional: bool = False) -> Any:
    """The object at a table path; with ``optional``, ``None`` when the last attribute is absent
    (Cohere2-MoE builds no ``shared_experts`` module when it has none)."""
    if path is None:
        return None
    root, path = (layer, path[1:]) if path.startswith("^") else (block, path)
    parent, _, name = path.rpartition(".")
    owner = _get(root, parent) if parent else root
    return getattr(owner, name, None) if optional else getattr(owner, name)


@dataclass(frozen=True)
class MoELayer:
    """One MoE decoder layer of a loaded model, read through its :class:`ArchSpec`."""

    index: int  # position of the decoder layer in the model
    layer: nn.Module
    block: nn.Module
    spec: ArchSpec
    rule: RoutingRule
    activation_fn: Callable[..., torch.Tensor] = field(repr=False)  # of gate; of gate and up if paired

    @property
    def router(self) -> nn.Module:
        return _get(self.block, self.spec.router)

    @property
    def experts(self) -> nn.Module:
        """The module the block calls with the routed tokens (hooked to see routing)."""
        return _get(self.block, self.spec.experts)

    @property
    def expert_module(self) -> nn.Module:
        """The module holding the expert tensors: ``experts`` itself, or DBRX's ``experts.mlp``."""
        experts = self.experts
        return experts if self.spec.expert_params is None else _get(experts, self.spec.expert_params)

    @property
    def router_weight(self) -> torch.Tensor:
        """``(E, H)`` router matrix."""
        return _get(self.router, self.spec.router_weight)

    @property
    def router_bias(self) -> torch.Tensor | None:
        """``(E,)`` bias added to the router logits (GPT-OSS), else ``None``."""
        return _find(self.layer, self.router, self.spec.router_bias)

    @property
    def correction_bias(self) -> torch.Tensor | None:
        """``(E,)`` selection-only bias (DeepSeek-V3 ``e_score_correction_bias``), else ``None``."""
        bias = _find(self.layer, self.block, self.spec.correction_bias)
        return None if bias is None else bias.reshape(-1)

    @property
    def shared_experts(self) -> nn.Module | None:
        return _find(self.layer, self.block, self.spec.shared_experts, optional=True)

    @property
    def shared_gate(self) -> nn.Module | None:
        return _find(self.layer, self.block, self.spec.shared_gate, optional=True)

    @property
    def num_experts(self) -> int:
        return self.router_weight.shape[0]

    @property
    def top_k(self) -> int:
        return self.rule.top_k

    def router_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``(T, E)`` raw logits for ``(T, H)`` hidden states, as the router computes them."""
        weight = self.router_weight
        if self.spec.router_fp32:
            weight = weight.float()
        return cap_logits(nn.functional.linear(hidden.to(weight.dtype), weight, self.router_bias), self.rule)

    def router_choice(self, out: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [T, E], index [T, k])`` from what this layer's router module returned.

        Most routers return ``(logits, weights, index)``; Llama 4's returns dense sigmoid scores
        and the logits, and the top-k of the logits is its own choice; DBRX's returns the logits
        alone, and its block's choice (top-k of their softmax, in their dtype) is taken the same way.
        """
        if isinstance(out, torch.Tensor):  # DBRX: the block takes top-k of the softmax itself
            probs = torch.softmax(out.detach(), dim=1, dtype=out.dtype)
            return out, torch.topk(probs, self.top_k, dim=-1).indices
        if self.spec.combine == "output":
            logits, _, index = out
            return logits, index
        _scores, logits = out
        return logits, torch.topk(logits.detach(), self.top_k, dim=1).indices

    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits [T, E], weights [T, k], index [T, k])`` for ``(T, H)`` hidden states."""
        logits = self.router_logits(hidden)
        weights, index = route(logits, self.rule, self.correction_bias)
        return logits, weights, index

    def expert(self, i: int) -> ExpertWeights:
        """Expert ``i`` in the uniform ``(gate, up, down)`` view."""
        ex = self.expert_module
        if self.spec.layout == "up_down":  # up [I, H], down [H, I]: no gate
            return ExpertWeights(None, ex.up_proj[i], ex.down_proj[i])
        if self.spec.layout == "stacked_rows":  # w1 (gate), v1 (up), w2 (down, transposed) [E·I, H]
            gate, up, down = (t.unflatten(0, (self.num_experts, -1))[i] for t in (ex.w1, ex.v1, ex.w2))
            return ExpertWeights(gate, up, down.T)
        gate_up, down = ex.gate_up_proj[i], ex.down_proj[i]
        bias = getattr(ex, "gate_up_proj_bias", None)
        down_bias = getattr(ex, "down_proj_bias", None)
        layout = self.spec.layout
        if layout == "fused":  # [2I, H]: gate rows, then up rows
            gate, up = gate_up.chunk(2, dim=0)
            gate_b, up_b = bias[i].chunk(2) if bias is not None else (None, None)
        elif layout == "fused_transposed":  # [H, 2I]: gate columns, then up columns
            gate, up = (t.T for t in gate_up.chunk(2, dim=1))
            gate_b, up_b = bias[i].chunk(2) if bias is not None else (None, None)
            down = down.T
        else:  # [H, 2I] with gate/up interleaved column by column
            gate, up = gate_up[:, 0::2].T, gate_up[:, 1::2].T
            gate_b, up_b = (bias[i][0::2], bias[i][1::2]) if bias is not None else (None, None)
            down = down.T
        return ExpertWeights(gate, up, down, gate_b, up_b, None if down_bias is None else down_bias[i])

    def expert_forward(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Output of expert ``i`` on ``(T, H)`` inputs, before any routing weight.

        A latent MoE (Nemotron-H with ``moe_latent_size``) runs its experts in a smaller space
        the block projects into and out of; the projections are applied here too, so the result
        is the expert's contribution in the hidden space either way.
        """
        w = self.expert(i)
        into, out_of = (
            _find(self.layer, self.block, path) for path in (self.spec.latent_in, self.spec.latent_out)
        )
        x = x if into is None else into(x)
        up = nn.functional.linear(x, w.up, w.up_bias)
        if w.gate is None:
            hidden = self.activation_fn(up)
        else:
            hidden = self._glu(nn.functional.linear(x, w.gate, w.gate_bias), up)
        y = nn.functional.linear(hidden, w.down, w.down_bias)
        return y if out_of is None else out_of(y)

    def _glu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.spec.activation == "clamped_swiglu":  # GPT-OSS; MiniMax-M3 names its alpha swiglu_alpha
            ex = self.experts
            alpha = getattr(ex, "alpha", None) or ex.swiglu_alpha
            gate = gate.clamp(max=ex.limit)
            up = up.clamp(min=-ex.limit, max=ex.limit)
            return (up + 1) * gate * torch.sigmoid(gate * alpha)
        if self.spec.activation == "paired":  # the experts' own act_fn combines both (Inkling 2)
            return self.activation_fn(gate, up)
        return self.activation_fn(gate) * up

    def shared_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """``(T, H)``: what the shared experts *inside the block* add to its output (gated where
        the architecture gates them, halved where it averages them with the routed output), or
        ``None``; GraniteMoE-Shared keeps its shared MLP on the decoder layer."""
        if self.shared_experts is None or (self.spec.shared_experts or "").startswith("^"):
            return None
        out = self.shared_experts(x)
        gate = self.shared_gate
        if self.spec.shared_combine and _find(self.layer, self.block, self.spec.shared_combine) == "average":
            out = out / 2
        return out if gate is None else torch.sigmoid(gate(x)) * out

    def block_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stock MoE block on ``(T, H)`` inputs, as ``(T, H)`` (blocks that also return
        router outputs, GPT-OSS and Llama 4, are unwrapped)."""
        out = self.block(x.unsqueeze(0))
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(x.shape)

    def named_expert_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor with one slice per routed expert on some axis, by attribute path.

        Router rows, router bias, correction bias and the fused expert tensors: the tensors
        expert pruning must slice.
        """
        path = ".".join(p for p in (self.spec.experts, self.spec.expert_params) if p)
        for name, param in self.expert_module.named_parameters(recurse=False):
            yield f"{path}.{name}", param
        yield f"{self.spec.router}.{self.spec.router_weight}", self.router_weight
        if self.spec.router_bias:
            yield f"{self.spec.router}.{self.spec.router_bias}", self.router_bias
        if self.spec.correction_bias:
            yield self.spec.correction_bias, _find(self.layer, self.block, self.spec.correction_bias)


@dataclass(frozen=True)
class MoEModel:
    """A loaded causal LM seen through its architecture row."""

    model: PreTrainedModel
    spec: ArchSpec
    layers: tuple[MoELayer, ...]
    dense_layers: tuple[int, ...]

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def num_layers(self) -> int:
        return len(self.layers) + len(self.dense_layers)

    @property
    def num_experts(self) -> int:
        return self.spec.num_experts(self.config)

    @property
    def top_k(self) -> int:
        return self.layers[0].rule.top_k if self.layers else self.spec.top_k(self.config)

    @cached_property
    def rule(self) -> RoutingRule:
        return self.spec.rule(self.config)

    def layer(self, index: int) -> MoELayer:
        """The MoE layer at decoder position ``index``."""
        for moe_layer in self.layers:
            if moe_layer.index == index:
                return moe_layer
        raise KeyError(f"decoder layer {index} is not an MoE layer; MoE layers: {self.moe_indices}")

    @property
    def moe_indices(self) -> list[int]:
        return [moe_layer.index for moe_layer in self.layers]


def decoder_model(model: nn.Module) -> nn.Module:
    """The base model under a causal LM's head: ``model.model``, or DBRX's ``model.transformer``."""
    for name in ("model", "transformer"):
        base = getattr(model, name, None)
        if isinstance(base, nn.Module):
            return base
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder stack of a causal LM (``model.model.layers``; DBRX's ``transformer.blocks``)."""
    base = decoder_model(model)
    layers = getattr(base, "layers", None)
    layers = getattr(base, "blocks", None) if layers is None else layers
    if layers is None:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} has no decoder layer stack at .model.layers; load the model "
            "with AutoModelForCausalLM."
        )
    return layers


# the expert tensor whose presence tells an MoE layer from a dense one, by layout
_FIRST_EXPERT_TENSOR: dict[str, str] = {
    "fused": "gate_up_proj",
    "fused_transposed": "gate_up_proj",
    "fused_transposed_interleaved": "gate_up_proj",
    "up_down": "up_proj",
    "stacked_rows": "w1",
}


def adapt(model: PreTrainedModel) -> MoEModel:
    """Read a loaded causal LM through its architecture row.

    Raises :class:`~moescope.errors.UnsupportedArchitectureError` for dense or unknown models.
    """
    spec = spec_for(model.config)
    rule = spec.rule(model.config)
    moe, dense = [], []
    for index, layer in enumerate(decoder_layers(model)):
        block = getattr(layer, spec.block, None)
        experts = getattr(block, spec.experts, None) if block is not None else None
        params = _find(layer, experts, spec.expert_params, optional=True) if experts is not None else None
        if not hasattr(params or experts, _FIRST_EXPERT_TENSOR[spec.layout]):
            dense.append(index)
            continue
        act = (
            getattr(params or experts, "act_fn", None) or getattr(params, "activation_fn", None) or nn.SiLU()
        )
        moe.append(MoELayer(index, layer, block, spec, rule, act))
    if not moe:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} has no MoE layers in this configuration; check the config's "
            "dense-layer settings (e.g. first_k_dense_replace, mlp_only_layers)."
        )
    return MoEModel(model, spec, tuple(moe), tuple(dense))
