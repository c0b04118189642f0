"""moescope's MoE instruments on a model another engine trains: hooks in, statistics out.

The replay measures routing, the first non-finite module and gradient norms by parameter group
inside its own loop (:mod:`moescope.replay.instruments`). An engine such as TRL's trainers owns
the loop, so :class:`MoEProbe` installs the same instruments as hooks on the stock model and
hands back, per optimizer step, the same canonical metrics, computed by the same functions:

- router forward hooks add each pass's per-layer expert counts, router entropy, top-k margin and
  largest logit to running sums (:func:`~moescope.replay.instruments.routing_sums`), then drop
  the logits: statistics only, never stored activations. Only passes with gradients enabled
  count (the trained tokens; generation and reference passes run without), and only the tokens
  the top model's ``attention_mask`` marks (padding left out);
- the model's output is checked in those passes (``isfinite`` on its tensors); when it is
  not finite, the same call is run once more with a hook on every module, which names the first
  one whose output went non-finite, as the replay does (a healthy step pays the one check; a
  sharded model, whose forward gathers each layer from every rank, has every rank run it again
  when any rank's output went non-finite);
- token entropy by response position bucket (and its histogram), where the output carries
  per-token entropies and the mask of the trained tokens (TRL's fused LM head), for
  ``EntropyFlow``;
- :meth:`MoEProbe.gradients` takes the norms per parameter group and the non-finite gradient
  count, where the engine calls it (after clipping in HF's Trainer: the caller rescales); under
  FSDP2 from each rank's shard, the squares summed over ranks (call :meth:`MoEProbe.regroup`
  once the model is sharded: sharding replaces its parameters).

A model moescope does not read as MoE (dense, unsupported) is refused by
:func:`~moescope.models.view.adapt` when the probe is made, before any training.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Any

import torch

from moescope import schema as S
from moescope.models.sharding import all_reduce_, is_sharded_model
from moescope.models.view import MoEModel, adapt
from moescope.replay.instruments import (
    GROUPS,
    HIST_BINS,
    POSITION_BUCKETS,
    RouterRecord,
    entropy_summary,
    grad_norms,
    has_nonfinite,
    parameter_groups,
    routing_sums,
    watch_nonfinite,
)
from moescope.replay.metrics import entropy_record, routing_metrics

__all__ = ["MoEProbe"]

_SUMS = ("counts", "entropy_sum", "tokens", "margin_sum", "margin_tokens")
_ENTROPY = {"bucket_sum": len(POSITION_BUCKETS), "bucket_count": len(POSITION_BUCKETS), "hist": HIST_BINS}


class MoEProbe:
    """Hooks on ``model`` that gather moescope's MoE statistics until :meth:`remove`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.moe: MoEModel = adapt(model)
        self.groups = parameter_groups(model, self.moe)
        self._mask: torch.Tensor | None = None
        self._stack = ExitStack()
        self._sums: dict[str, Any] = {}
        self._locating = False
        self._located = False  # one search per step
        self.first_module: str | None = None
        self._entropy: dict[str, torch.Tensor] = {}
        self.vocab = int(model.config.get_text_config().vocab_size)
        self._install()

    def _install(self) -> None:
        def keep_mask(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            mask = kwargs.get("attention_mask")
            self._mask = mask if torch.is_tensor(mask) and mask.dim() == 2 else None

        def check(module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            if self._locating or self._located or not torch.is_grad_enabled():
                return
            if self._on_any_rank(has_nonfinite(out)):  # logits, or a fused LM head's log-probs (TRL's)
                self._located = True
                self.first_module = self._locate(args, kwargs)
            self._add_entropy(out)

        handles = [
            self.model.register_forward_pre_hook(keep_mask, with_kwargs=True),
            self.model.register_forward_hook(check, with_kwargs=True),
        ]
        for row, layer in enumerate(self.moe.layers):

            def route(module: torch.nn.Module, args: tuple, out: Any, _layer=layer, _row=row) -> None:
                if torch.is_grad_enabled() and not self._locating:
                    with torch.no_grad():
                        self._add_routing(*_layer.router_choice(out), _row)

            handles.append(layer.router.register_forward_hook(route))
        for handle in handles:
            self._stack.callback(handle.remove)

    def _on_any_rank(self, flag: bool) -> bool:
        """``flag`` or'ed over the ranks of a sharded model: the search runs the forward again,
        and a sharded forward gathers each layer from every rank, so all ranks must run it."""
        if not (distributed() and is_sharded_model(self.model)):
            return flag
        any_rank = torch.tensor([float(flag)])
        all_reduce_(any_rank, torch.distributed.ReduceOp.MAX)
        return bool(any_rank.item())

    def _locate(self, args: tuple, kwargs: dict) -> str | None:
        """The first module whose output goes non-finite when the same call runs again (the
        forward is deterministic; the faults' hooks are still in place)."""
        self._locating = True
        try:
            with watch_nonfinite(self.model) as watch:
                self.model(*args, **kwargs)
            return watch.first_module
        finally:
            self._locating = False

    def _add_routing(self, logits: torch.Tensor, index: torch.Tensor, row: int) -> None:
        rows = logits.reshape(-1, logits.shape[-1])
        mask = self._mask
        valid = mask.reshape(-1) if mask is not None and mask.numel() == rows.shape[0] else None
        record = RouterRecord([rows], [index.reshape(-1, index.shape[-1])], [row])
        sums = routing_sums(record, valid if valid is not None else torch.ones(rows.shape[0]), self.moe)
        for key in _SUMS:
            self._sums[key] = self._sums.get(key, 0) + sums[key]
        self._sums["max_logit"] = max(float(sums["max_logit"]), self._sums.get("max_logit", 0.0))

    def _add_entropy(self, out: Any) -> None:
        """Token entropy by response position, where the output carries per-token entropies and
        the mask of the tokens trained on (TRL's fused LM head: ``entropy``, ``label_mask``)."""
        entropy, mask = getattr(out, "entropy", None), getattr(out, "label_mask", None)
        if not (torch.is_tensor(entropy) and torch.is_tensor(mask) and entropy.shape == mask.shape):
            return
        with torch.no_grad():
            m = mask.float()
            positions = (m.cumsum(-1) - 1).clamp(min=0)  # the position in the response
            summary = entropy_summary(entropy.detach(), m, positions, self.vocab)
        for key, values in summary.items():
            self._entropy[key] = self._entropy.get(key, 0) + torch.tensor(values, dtype=torch.float64)

    def regroup(self) -> None:
        """Group the parameters anew: sharding (``fully_shard``) replaces every parameter of the
        model with a ``DTensor`` one, so groups taken before it would see no gradients."""
        self.groups = parameter_groups(self.model, self.moe)

    def gradients(self) -> dict[str, float]:
        """Gradient norm per parameter group, their total, and the non-finite gradient values."""
        squares, total, bad = grad_norms(self.groups)
        out = {S.GRAD_NORM_GROUP + name: math.sqrt(squares[name]) for name in GROUPS if name in squares}
        return {**out, "total": total, S.NONFINITE: bad}

    def take(self) -> dict[str, Any]:
        """The MoE metrics since the last call (routing, first non-finite module), summed over
        every process of a distributed run (call it on all of them), then reset."""
        out: dict[str, Any] = {}
        sums, entropy, named = self._reduced()
        if float(sums["_r/tokens"].sum()) > 0:
            out.update(routing_metrics(sums))
        first = _first_of_ranks(self.first_module) if named else None
        if first is not None:
            out[S.FIRST_NONFINITE_MODULE] = first
        if entropy is not None:
            out[S.TOKEN_ENTROPY] = entropy_record(entropy, self.vocab)
        self._sums, self.first_module, self._located, self._entropy = {}, None, False, {}
        return out

    def _reduced(self) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None, bool]:
        """The routing sums, the entropy sums (``None`` where no process had any) and whether a
        process named a non-finite module, over every process in one summing collective (the ranks
        wait for each collective on every step; the largest logit rides along, one slot a rank)."""
        layers, experts = len(self.moe.layers), self.moe.num_experts
        shapes = {"counts": (layers, experts), **{key: (layers,) for key in _SUMS[1:]}}
        parts = {key: torch.as_tensor(self._sums.get(key, torch.zeros(size))) for key, size in shapes.items()}
        parts |= {f"_te/{key}": self._entropy.get(key, torch.zeros(n)) for key, n in _ENTROPY.items()}
        parts["named"] = torch.tensor([float(self.first_module is not None)])
        rank, world = _rank_and_world()
        parts["peaks"] = torch.zeros(world)  # each rank's largest logit in its own slot: the sum holds all
        parts["peaks"][rank] = float(self._sums.get("max_logit", 0.0))
        flat = all_reduce_(torch.cat([part.double().reshape(-1) for part in parts.values()]))
        split = dict(zip(parts, torch.split(flat, [part.numel() for part in parts.values()]), strict=True))
        sums = {f"_r/{key}": split[key].float() for key in _SUMS}
        sums["_r/max_logit"] = float(split["peaks"].max())
        sums["_r/counts"] = sums["_r/counts"].reshape(layers, experts)
        counted = float(split["_te/bucket_count"].sum()) > 0
        entropy = {f"_te/{key}": split[f"_te/{key}"] for key in _ENTROPY} if counted else None
        return sums, entropy, bool(split["named"].item())

    def remove(self) -> None:
        """Take every hook off the model."""
        self._stack.close()


def distributed() -> bool:
    """Whether this process is one of several in an initialised process group."""
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def _rank_and_world() -> tuple[int, int]:
    if not distributed():
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _first_of_ranks(name: str | None) -> str | None:
    """The first module named by the lowest rank that named one."""
    if not distributed():
        return name
    names: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(names, name)
    return next((n for n in names if n is not None), None)
