"""moescope's faults inside a 🤗 Trainer (TRL's included), under the replay's names and syntax.

``NAME[@STEP][:ARG]`` as in ``moescope replay --fault`` (:mod:`moescope.replay.faults`); the
steps are the trainer's optimizer steps, counted from 0. What each becomes here, and the
signature it leaves in the trace:

``lr_spike``
    Every parameter group's learning rate × ARG just before the step's optimizer update (the
    scheduler sets it back on its next step): ``optim/lr`` jumps, a gradient spike follows.
``nan_op``
    NaN written into one module's output (default: the last MoE layer's routed experts) in the
    step's training passes (gradients on), never in generation: ``health/nonfinite`` and
    ``health/first_nonfinite_module`` at the step. The Trainer then applies the NaN update, and
    sampling on NaN weights stops the run, as it would a real one: the trace ends there.
``update_omission``
    The optimizer's update skipped from the step on: ``actor/update_applied`` 0 while
    ``actor/grad_norm`` > 0; the weights stay as they were.
``router_precision``
    Every router scored with its inputs and weight rounded to ARG (bf16, fp16, fp8), as a
    low-precision gate kernel would: ``rollout/routing_flip_frac`` (and per layer), the share of
    routing choices that differ from a full-precision router on the same inputs.
``routing_mismatch``
    The same rounding in the generation passes only (gradients off): the sampler chooses other
    experts than the trainer for a share of tokens, logged as ``rollout/routing_flip_frac``.
    Under FSDP a process that has finished sampling runs the others' last forwards with them
    (synced generation), and those passes count too: the share is over a few more tokens.
``reward_scale``
    The rewards × ARG from the step on: ``reward/mean`` and ``reward/std`` jump by the factor.
    Needs the trainer's reward functions, so it is installed by :func:`instrument`.
``no_grad_clip``
    Gradient clipping off (``max_grad_norm`` 0) from the step on: ``optim/clip_coef`` stays 1
    while the gradient norm exceeds the configured bound.

``resume_state``
    The optimizer's state (AdamW's moments and step count) dropped just before the step's
    update, as a resume that restored the weights but not the optimizer: ``optim/state_steps``
    goes back to 1 at the step (finding ``optimizer_reset``).

With activation checkpointing on (TRL's default), a fault that changes which experts a token
reaches (``nan_op``: NaN scores route anywhere; ``router_precision``) can make torch's
recomputation in the backward dispatch differently from the forward, and torch stops the run
with a ``CheckpointError``; set ``gradient_checkpointing=False`` for those runs.

The replay's other faults (``fp16_overflow``, ``rollout_logprob_precision``, ``aux_loss_off``,
``entropy_control_off``) act on machinery a Trainer does not have as such; naming one is one
sentence. So do the other mismatch faults: ``engine_drift``, ``parallel_reduction`` and
``stale_routes`` act on a second engine's log-probs or on routing replay, and TRL's GRPO scores
the old log-probs with the trained model itself (its vLLM engine is outside the process);
``packing_positions`` needs a packing collator TRL's GRPO does not use; and ``aux_loss_double``
would double a loss the model computes inside its own forward, whose coefficient TRL reads from
the model config (a run with it doubled is a config, not a fault: set ``router_aux_loss_coef``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

from moescope import schema as S
from moescope._util.forwards import patched_forwards
from moescope.errors import MoescopeError
from moescope.models.sharding import all_reduce_
from moescope.models.view import MoEModel
from moescope.replay.faults import Fault, find_fault, parse_faults
from moescope.replay.forward import default_nan_module, nan_output
from moescope.replay.precision import call_rounded

__all__ = ["SUPPORTED", "TrainerFaults"]

SUPPORTED = (
    "lr_spike",
    "nan_op",
    "update_omission",
    "router_precision",
    "routing_mismatch",
    "reward_scale",
    "no_grad_clip",
    "resume_state",
)


class TrainerFaults:
    """The faults of one run, driven by the callback's events."""

    def __init__(self, texts: tuple[str, ...] | list[str], model: torch.nn.Module, moe: MoEModel) -> None:
        self.faults = self.check(parse_faults(list(texts)))
        self.model, self.moe = model, moe
        self.step = 0
        self._max_grad_norm: float | None = None
        self._stack = ExitStack()
        self._step_stack = ExitStack()
        self._flips = torch.zeros(len(moe.layers))
        self._routed = torch.zeros(len(moe.layers))
        self._applied = True
        self._lr: float | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        low = self._get("router_precision") or self._get("routing_mismatch")
        self._rounding = low is not None
        if low is not None:
            self._stack.enter_context(self._rounded_routers(low))

    @staticmethod
    def check(faults: list[Fault]) -> list[Fault]:
        """Refuse a fault with no equivalent inside a Trainer, in one sentence."""
        other = [f.name for f in faults if f.name not in SUPPORTED]
        if other:
            raise MoescopeError(
                f"fault {other[0]} has no equivalent inside a Trainer; use one of {', '.join(SUPPORTED)} "
                "here, or moescope replay for the rest."
            )
        return faults

    def describe(self) -> list[str]:
        return [str(f) for f in self.faults]

    def _get(self, name: str, step: int | None = None) -> Fault | None:
        return find_fault(self.faults, name, step)

    # -- the callback's events
    def step_begin(self, step: int, args: Any) -> None:
        self.step = step
        if self._max_grad_norm is None:
            self._max_grad_norm = float(args.max_grad_norm or 0.0)
        args.max_grad_norm = 0.0 if self._get("no_grad_clip", step) else self._max_grad_norm
        nan = self._get("nan_op", step)
        if nan is not None:
            module = nan.arg or default_nan_module(self.model, self.moe)
            self._step_stack.enter_context(nan_output(self.model, module, when=torch.is_grad_enabled))

    def before_update(self, optimizer: torch.optim.Optimizer) -> None:
        spike = self._get("lr_spike", self.step)
        if spike is not None:
            for group in optimizer.param_groups:
                group["lr"] *= spike.arg
        self._lr = float(optimizer.param_groups[0]["lr"])
        self._optimizer = optimizer
        if self._get("resume_state", self.step) is not None:  # the weights kept, AdamW's state lost
            optimizer.state.clear()
        self._applied = self._get("update_omission", self.step) is None
        if not self._applied:
            self._step_stack.enter_context(_skipped(optimizer))

    def after_update(self) -> None:
        self._step_stack.close()
        self._step_stack = ExitStack()

    def reward_factor(self) -> float:
        scale = self._get("reward_scale", self.step)
        return float(scale.arg) if scale is not None else 1.0

    def clip_coef(self, grad_norm: Any) -> dict[str, float]:
        """The factor clipping applied to this step's gradients (1: not clipped), from the
        pre-clip norm the trainer logged."""
        if not isinstance(grad_norm, int | float) or not grad_norm > 0:
            return {}
        bound = 0.0 if self._get("no_grad_clip", self.step) else (self._max_grad_norm or 0.0)
        return {S.CLIP_COEF: min(1.0, bound / grad_norm) if bound > 0 else 1.0}

    def take(self) -> dict[str, Any]:
        """This step's fault-side metrics: whether the update was applied, routing flips."""
        out: dict[str, Any] = {S.UPDATE_APPLIED: int(self._applied)}
        if self._lr is not None:
            out[S.LR] = self._lr  # the rate applied (TRL logs its scheduler's)
            self._lr = None
        if self._optimizer is not None:
            steps = [float(s["step"]) for s in self._optimizer.state.values() if "step" in s]
            if steps:
                out[S.OPTIMIZER_STEPS] = round(max(steps))
        flips, routed = self._flips, self._routed
        if self._rounding:  # each process samples its share (no collective where nothing is rounded)
            flips, routed = all_reduce_(torch.stack([flips, routed]))
        if routed.sum() > 0:
            layers = flips / routed.clamp(min=1)
            out[S.ROUTING_FLIP_FRAC] = float(layers.mean())
            out[S.ROUTING_FLIP_LAYERS] = layers.tolist()
        self._flips.zero_()
        self._routed.zero_()
        return out

    def close(self) -> None:
        self.after_update()
        self._stack.close()

    # -- the low-precision router
    def _rounded_routers(self, fault: Fault) -> Any:
        """Routers rounded to the fault's precision where it applies (every pass for
        router_precision, the generation passes for routing_mismatch), from its step on; each
        rounded call is compared with a full-precision call on the same inputs."""
        only_sampling = fault.name == "routing_mismatch"

        def wrap(row: int) -> Callable[[Callable], Callable]:
            layer = self.moe.layers[row]

            def around(original: Callable) -> Callable:
                def forward(*args: Any, **kwargs: Any) -> Any:
                    if not fault.active(self.step) or (only_sampling and torch.is_grad_enabled()):
                        return original(*args, **kwargs)
                    out = call_rounded(original, layer.router_weight, fault.arg, *args, **kwargs)
                    with torch.no_grad():
                        rounded = layer.router_choice(out)[1]
                        exact = layer.router_choice(original(*args, **kwargs))[1]
                        rounded, exact = rounded.reshape(-1, rounded.shape[-1]), exact.reshape(rounded.shape)
                        differs = (rounded.sort(-1).values != exact.sort(-1).values).any(-1)
                        self._flips[row] += float(differs.sum())
                        self._routed[row] += float(differs.numel())
                    return out

                return forward

            return around

        return patched_forwards((layer.router, wrap(row)) for row, layer in enumerate(self.moe.layers))


class _skipped:
    """The optimizer's ``step`` as a no-op while active (the update_omission fault)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def __enter__(self) -> None:
        self.optimizer.step = lambda *args, **kwargs: None

    def __exit__(self, *exc: object) -> None:
        del self.optimizer.step
