"""The trainer's forward passes: training precision, this step's faults, where a non-finite
value started, and the no-gradient pass that gives the old and reference log-probs.

The rollout engine stays clean: a NaN there would stop sampling itself, while the failures
replayed here are those of the training side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch

from moescope.errors import MoescopeError
from moescope.models.view import MoEModel
from moescope.replay.batch import Batch, token_logprobs
from moescope.replay.comm import Comm
from moescope.replay.config import ReplayConfig
from moescope.replay.faults import Fault, FaultPlan
from moescope.replay.instruments import (
    NonfiniteWatch,
    RouterRecord,
    record_routers,
    routing_flips,
    watch_nonfinite,
)
from moescope.replay.losses import is_weights, k3_kl, masked_sum
from moescope.replay.models import Models
from moescope.replay.precision import fp32_routers, rounded_router
from moescope.replay.router_replay import check_replayable, replayed_routing
from moescope.replay.sums import StepSums


class TrainingForward:
    """Forward passes of the policy in training, with the faults of the step installed."""

    def __init__(
        self, models: Models, config: ReplayConfig, faults: FaultPlan, comm: Comm | None = None
    ) -> None:
        self.m, self.c, self.faults, self.comm = models, config, faults, comm or Comm()
        if config.routing_replay:
            check_replayable(models.moe)
        # the weight looked up per call: under FSDP2 it is whole only while its router runs
        self.routers = [(layer.router, _weight_of(layer)) for layer in models.moe.layers]
        self.watch = NonfiniteWatch()

    @contextmanager
    def step_faults(self, step: int) -> Iterator[NonfiniteWatch]:
        """Install this step's faults of the trainer's forward passes; yield the non-finite watch."""
        with ExitStack() as stack:
            nan = self.faults.get("nan_op", step)
            if nan is not None:
                stack.enter_context(
                    nan_output(self.m.policy, nan.arg or default_nan_module(self.m.policy, self.m.moe))
                )
            self.watch = NonfiniteWatch()
            yield self.watch

    def context(self, step: int) -> ExitStack:
        """Context of a training forward: the router_precision fault's low-precision router, or
        the fp32_router fix's full-precision one."""
        return self._router_context(self.faults.get("router_precision", step))

    def rollout_context(self, step: int) -> ExitStack:
        """Context of the rollout engine's passes (sampling, its log-probs): the routing_mismatch
        fault's low-precision router, or the fp32_router fix's full-precision one."""
        return self._router_context(self.faults.get("routing_mismatch", step))

    def _router_context(self, fault: Fault | None) -> ExitStack:
        stack = ExitStack()
        if self.c.fp32_router:  # the fix: routers in fp32 on both sides, whatever a fault rounds
            stack.enter_context(fp32_routers(self.routers))
        elif fault is not None:
            stack.enter_context(rounded_router(self.routers, fault.arg))
        return stack

    def logprobs(
        self, model: torch.nn.Module, batch: Batch, precision: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """:func:`token_logprobs` at the run's temperature, in ``precision`` (default: training's)."""
        return token_logprobs(
            model, batch, temperature=self.c.temperature, precision=precision or self.c.precision
        )

    def attribute(self, out: Any, batch: Batch, step: int) -> None:
        """When a training forward's logits are not finite, find the first module that went so.

        The forward is deterministic, so it is run once more (no gradient) with a hook on every
        module; healthy steps pay one ``isfinite`` on the logits and nothing else.
        """
        if not self.c.instruments:
            return
        wanted = self.watch.first_module is None and not bool(torch.isfinite(out.logits).all())
        if not (self.comm.any_(wanted) if self.comm.sharded else wanted):  # sharded: all run it or none
            return
        with torch.no_grad(), watch_nonfinite(self.m.policy) as watch, self.context(step):
            self.logprobs(self.m.policy, batch)
        if wanted:
            self.watch.first_module = watch.first_module

    @torch.no_grad()
    def old_logprobs(self, batch: Batch, step: int, sums: StepSums) -> dict[str, torch.Tensor]:
        """Old log-probs and entropy (the rollout's under ``rollout_logprob_precision`` or
        ``routing_mismatch``), the reference's log-probs, the rollout-vs-training log-prob
        mismatch, and under routing replay the rollout's expert choices (``"route"``)."""
        c, out = self.c, {}
        if not len(batch.input_ids):
            return out
        mask = batch.response_mask
        flips = self.faults.get("routing_mismatch", step) is not None
        low = self.faults.get("rollout_logprob_precision", step)
        rollout_prec = low.arg if low is not None else c.rollout_dtype_name
        two_engines = (
            rollout_prec != c.precision or flips or self.faults.get("router_precision", step) is not None
        )
        rolled = (
            self._rollout_pass(batch, step, rollout_prec, flips) if two_engines and c.routing_replay else None
        )
        replay = replayed_routing(self.m.moe, rolled[1].index) if rolled else nullcontext()
        watch = flips or (c.routing_replay and not two_engines)
        with record_routers(self.m.moe, enabled=watch) as trained, self.context(step), replay:
            old, ent, raw = self.logprobs(self.m.policy, batch)
        self.attribute(raw, batch, step)
        out["old"], out["old_entropy"] = old, ent
        sums.add("_old_entropy", masked_sum(ent, mask))
        sums.add("_old_tokens", mask.sum())
        if two_engines:
            roll, rolled_routes = rolled or self._rollout_pass(batch, step, rollout_prec, flips)
            if c.routing_replay:
                out["route"] = rolled_routes.index
            if flips:
                flipped, tokens = routing_flips(
                    trained, rolled_routes, batch.attention_mask, len(self.m.moe.layers)
                )
                sums.add("flips", flipped)
                sums.add("flip_tokens", tokens)
            sums.add("mismatch_sum", masked_sum((roll - old).abs().nan_to_num(0.0), mask))
            sums.add("mismatch_k3", masked_sum(k3_kl(roll, old).nan_to_num(0.0), mask))
            ratio = (old - roll).exp().nan_to_num(0.0, posinf=0.0)  # training / rollout, per token
            sums.add("is_ratio", masked_sum(ratio, mask))
            sums.add("is_ratio_sq", masked_sum(ratio.square(), mask))
            sums.add("mismatch_tokens", mask.sum())
            if c.is_correction is not None:  # the trainer's old log-probs, corrected toward the rollout's
                weight, cut = is_weights(old, roll, mask, c.is_correction, c.is_threshold)
                out["is_weight"] = weight
                sums.add("is_cut", masked_sum(cut, mask))
            elif low is not None or flips:
                out["old"] = roll
        elif c.routing_replay:
            out["route"] = trained.index  # one engine: the trainer's own pass is the rollout's choice
        if self.m.reference is not None:
            out["ref"] = self.logprobs(self.m.reference, batch)[0]
        return out

    def _rollout_pass(
        self, batch: Batch, step: int, precision: str, flips: bool
    ) -> tuple[torch.Tensor, RouterRecord]:
        """The rollout engine's log-probs of the batch, and its expert choices when needed."""
        watch = flips or self.c.routing_replay
        with record_routers(self.m.moe, enabled=watch) as routes, self.rollout_context(step):
            roll, _, _ = self.logprobs(self.m.policy, batch, precision)
        return roll, routes


def _weight_of(layer: Any) -> Callable[[], torch.Tensor]:
    return lambda: layer.router_weight


def default_nan_module(model: torch.nn.Module, moe: MoEModel) -> str:
    """The ``nan_op`` fault's default module: the last MoE layer's routed experts."""
    experts = moe.layers[-1].experts
    return next(name for name, mod in model.named_modules() if mod is experts)


@contextmanager
def nan_output(
    model: torch.nn.Module, module_name: str, *, when: Callable[[], bool] | None = None
) -> Iterator[None]:
    """Write NaN into the output of ``module_name`` (the ``nan_op`` fault); with ``when``, only
    in the passes where it returns true. The hook runs before any other on that module, so a
    non-finite watch names this module."""
    modules = dict(model.named_modules())
    if module_name not in modules:
        near = [n for n in modules if n.endswith(module_name.split(".")[-1])][:3]
        raise MoescopeError(
            f"nan_op names module {module_name!r}, which this model does not have"
            + (f"; did you mean {', '.join(near)}?" if near else "; see model.named_modules().")
        )

    def hook(module, args, out):
        return _poison(out) if when is None or when() else None

    handle = modules[module_name].register_forward_hook(hook, prepend=True)
    try:
        yield
    finally:
        handle.remove()


def _poison(out: Any) -> Any:
    if torch.is_tensor(out) and out.is_floating_point():
        return torch.full_like(out, float("nan"))
    if isinstance(out, tuple):
        return (_poison(out[0]), *out[1:])
    return out
