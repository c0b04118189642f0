"""Training and rollout precision: fp32, bf16 autocast, fp16 autocast with dynamic loss scaling.

Weights and optimizer states stay fp32 (the "master copy"); ``bf16`` and ``fp16`` run the forward
under ``torch.autocast``, so matmuls happen in the low precision as on an accelerator. fp16 adds
a :class:`torch.amp.GradScaler`: the loss is multiplied by the scale before backward, and a step
whose gradients hold an Inf or NaN is skipped while the scale halves — both go into the trace
(``optim/skipped``, ``optim/loss_scale``). The rollout engine has its own precision, so a
rollout/training log-prob mismatch can be reproduced on purpose.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from moescope._util.forwards import patched_forwards

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ROUTER_DTYPES = {**DTYPES, "fp8": torch.float8_e4m3fn}
"""What a router can be rounded to (:func:`rounded_router`): fp8 e4m3 as some engines score it."""


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward context of ``precision`` on ``device`` (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


class LossScaler:
    """Dynamic loss scaling for fp16 (a thin wrapper over GradScaler); identity otherwise."""

    def __init__(
        self, precision: str, device: torch.device, init_scale: float, *, sharded: bool = False
    ) -> None:
        self.enabled = precision == "fp16"
        if sharded:  # each process sees only its gradient shards: an overflow found anywhere skips everywhere
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self._scaler = ShardedGradScaler(device.type, init_scale=init_scale, enabled=self.enabled)
        else:
            self._scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=self.enabled)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self._scaler.scale(loss)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.enabled:
            self._scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step unless the gradients overflowed; returns True when the step was skipped."""
        if not self.enabled:
            optimizer.step()
            return False
        before = self._scaler.get_scale()
        self._scaler.step(optimizer)
        self._scaler.update()
        return self._scaler.get_scale() < before

    @property
    def value(self) -> float:
        """The current loss scale (1.0 when scaling is off)."""
        return float(self._scaler.get_scale()) if self.enabled else 1.0

    def multiply(self, factor: float) -> None:
        """Multiply the scale (the ``fp16_overflow`` fault's lever)."""
        if self.enabled:
            self._scaler.update(self._scaler.get_scale() * factor)

    def state_dict(self) -> dict:
        return self._scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.enabled and state:
            self._scaler.load_state_dict(state)


@contextlib.contextmanager
def rounded_router(
    routers: list[tuple[torch.nn.Module, torch.Tensor | Callable[[], torch.Tensor]]], precision: str
) -> Iterator[None]:
    """Compute router logits in ``precision``: inputs and weight rounded to it for each call.

    ``routers`` pairs each router module with its weight, or with a function returning it: a
    sharded model (FSDP2) holds the whole weight only while the router runs, so it is looked up
    at call time. Simulates a router scored in bf16 /
    fp16 by an inference engine or a fused kernel: the top-k choice flips wherever two experts'
    scores are closer than the rounding error. The fp32 weight is restored bit for bit after
    every call, so the optimizer keeps updating the master copy.
    """

    def rounding(weight: torch.Tensor | Callable[[], torch.Tensor]) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            def low_precision(*args, **kwargs):
                current = weight() if callable(weight) else weight
                return call_rounded(original, current, precision, *args, **kwargs)

            return low_precision

        return wrap

    with patched_forwards((router, rounding(weight)) for router, weight in routers):
        yield


def call_rounded(forward: Callable, weight: torch.Tensor, precision: str, *args, **kwargs) -> object:
    """One router call with its inputs and ``weight`` rounded to ``precision``; the weight is
    restored bit for bit afterwards."""
    dtype = ROUTER_DTYPES[precision]
    master = weight.data.clone()
    weight.data.copy_(master.to(dtype))
    try:
        return forward(*(_round(a, dtype) for a in args), **kwargs)
    finally:
        weight.data.copy_(master)


def _round(value: object, dtype: torch.dtype) -> object:
    if torch.is_tensor(value) and value.is_floating_point():
        return value.to(dtype).to(value.dtype)
    return value


@contextlib.contextmanager
def fp32_routers(routers: list[tuple[torch.nn.Module, torch.Tensor]]) -> Iterator[None]:
    """Compute router logits in fp32 whatever the surrounding autocast (Megatron's
    ``moe_router_dtype=fp32``): inputs cast up, autocast off for the router call."""

    def wrap(original: Callable) -> Callable:
        def full_precision(*args, **kwargs):
            device = next((a.device.type for a in args if torch.is_tensor(a)), "cpu")
            with torch.autocast(device_type=device, enabled=False):
                return original(*(_upcast(a) for a in args), **kwargs)

        return full_precision

    with patched_forwards((router, wrap) for router, _ in routers):
        yield


def _upcast(value: object) -> object:
    if torch.is_tensor(value) and value.is_floating_point():
        return value.float()
    return value
