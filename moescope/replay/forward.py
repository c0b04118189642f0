"""The trainer's forward passes: training precision, this step's faults, where a non-finite
value started, and the no-gradient pass that gives the old and reference log-probs.

The rollout engine stays clean: a NaN there would stop sampling itself, while the failures
replayed here are those of the training side.
"""

from __future__ import annotations

import functools
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
from moescope.replay.wiring import combined_in, drifted, mismatch_keep, on_output, stale

TRAINER_SIDE = ("router_precision", "parallel_reduction", "packing_positions", "stale_routes")
"""Faults of the trainer's passes: the old log-probs stay the trainer's, the rollout's differ."""


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
        self._routes: dict[int, list[torch.Tensor]] = {}  # this step's replayed routes, by minibatch
        self._last_routes: dict[int, list[torch.Tensor]] = {}  # the previous step's

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
        the fp32_router fix's full-precision one; the parallel_reduction fault's combine."""
        stack = self._router_context(self.faults.get("router_precision", step))
        reduction = self.faults.get("parallel_reduction", step)
        if reduction is not None:
            stack.enter_context(combined_in(self.m.moe, reduction.arg))
        return stack

    def packed(self, step: int) -> bool:
        """Whether the trainer's passes lose the rows' boundaries (the packing_positions fault)."""
        return self.c.packing and self.faults.get("packing_positions", step) is not None

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
        self, model: torch.nn.Module, batch: Batch, precision: str | None = None, *, packed: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """:func:`token_logprobs` at the run's temperature, in ``precision`` (default: training's);
        ``packed``: the rows as one sequence whose boundaries are lost."""
        return token_logprobs(
            model,
            batch,
            temperature=self.c.temperature,
            precision=precision or self.c.precision,
            packed=packed,
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
    def old_logprobs(
        self, batch: Batch, step: int, sums: StepSums, index: int = 0
    ) -> dict[str, torch.Tensor]:
        """Old log-probs and entropy (the rollout's under a rollout-side fault), the reference's
        log-probs, the rollout-vs-training log-prob mismatch, and under routing replay the
        routes the trainer replays (``"route"``: the rollout's choices, or a stale_routes
        fault's); ``index`` is the minibatch's position in the step."""
        c, out = self.c, {}
        if not len(batch.input_ids):
            return out
        mask = batch.response_mask
        get = functools.partial(self.faults.get, step=step)
        flips = get("routing_mismatch") is not None
        low, drift = get("rollout_logprob_precision"), get("engine_drift")
        rollout_side = low is not None or flips or drift is not None
        rollout_prec = low.arg if low is not None else c.rollout_dtype_name
        two_engines = (
            rollout_prec != c.precision or rollout_side or any(get(n) is not None for n in TRAINER_SIDE)
        )
        rolled = (
            self._rollout_pass(batch, step, rollout_prec, flips) if two_engines and c.routing_replay else None
        )
        routes = self._replayed(rolled[1].index, batch, step, index) if rolled else None
        replay = replayed_routing(self.m.moe, routes) if routes else nullcontext()
        watch = flips or (c.routing_replay and not two_engines)
        packed = self.packed(step)
        with record_routers(self.m.moe, enabled=watch) as trained, self.context(step), replay:
            old, ent, raw = self.logprobs(self.m.policy, batch, packed=packed)
        self.attribute(raw, batch, step)
        out["old"], out["old_entropy"] = old, ent
        sums.add("_old_entropy", masked_sum(ent, mask))
        sums.add("_old_tokens", mask.sum())
        if two_engines:
            roll, rolled_routes = rolled or self._rollout_pass(batch, step, rollout_prec, flips)
            if drift is not None:
                roll = drifted(roll, drift, step, c.seed)
            if c.routing_replay:
                out["route"] = routes
            if flips:
                flipped, tokens = routing_flips(
                    trained, rolled_routes, batch.attention_mask, len(self.m.moe.layers)
                )
                sums.add("flips", flipped)
                sums.add("flip_tokens", tokens)
            self._mismatch_sums(old, roll, mask, sums)
            out.update(self._corrections(old, roll, mask, rollout_side, sums))
        elif c.routing_replay:
            out["route"] = trained.index  # one engine: the trainer's own pass is the rollout's choice
            self._routes[index] = trained.index
        if self.m.reference is not None:
            out["ref"] = self.logprobs(self.m.reference, batch, packed=packed)[0]
        return out

    def end_step(self) -> None:
        """The step's replayed routes become the previous step's (the stale_routes:step fault)."""
        self._last_routes, self._routes = self._routes, {}

    def _replayed(
        self, routes: list[torch.Tensor], batch: Batch, step: int, index: int
    ) -> list[torch.Tensor]:
        """The routes the trainer replays: the rollout's, or the stale_routes fault's."""
        self._routes[index] = routes
        fault = self.faults.get("stale_routes", step)
        if fault is None:
            return routes
        return stale(routes, tuple(batch.input_ids.shape), fault.arg, self._last_routes.get(index))

    @staticmethod
    def _mismatch_sums(old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor, sums: StepSums) -> None:
        """The mismatch metrics' sums: |Δ log-prob|, k3 KL(rollout ‖ training), the IS ratio."""
        sums.add("mismatch_sum", masked_sum((roll - old).abs().nan_to_num(0.0), mask))
        sums.add("mismatch_k3", masked_sum(k3_kl(roll, old).nan_to_num(0.0), mask))
        ratio = (old - roll).exp().nan_to_num(0.0, posinf=0.0)  # training / rollout, per token
        sums.add("is_ratio", masked_sum(ratio, mask))
        sums.add("is_ratio_sq", masked_sum(ratio.square(), mask))
        sums.add("mismatch_tokens", mask.sum())

    def _corrections(
        self, old: torch.Tensor, roll: torch.Tensor, mask: torch.Tensor, rollout_side: bool, sums: StepSums
    ) -> dict[str, torch.Tensor]:
        """The fixes' weights of the loss (``"is_weight"``: IS correction times the masks), or
        under a rollout-side fault without IS correction the rollout's log-probs as the old ones."""
        c, out, weight = self.c, {}, None
        if c.is_correction is not None:  # the trainer's old log-probs, corrected toward the rollout's
            weight, cut = is_weights(old, roll, mask, c.is_correction, c.is_threshold)
            sums.add("is_cut", masked_sum(cut, mask))
        elif rollout_side:
            out["old"] = roll
        keep = mismatch_keep(old, roll, mask, c.is_mask, c.seq_kl_mask)
        if keep is not None:
            sums.add("masked", masked_sum(1 - keep, mask))
            weight = keep if weight is None else weight * keep
        if weight is not None:
            out["is_weight"] = weight
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
        return on_output(out, lambda t: torch.full_like(t, float("nan"))) if when is None or when() else None

    handle = modules[module_name].register_forward_hook(hook, prepend=True)
    try:
        yield
    finally:
        handle.remove()
