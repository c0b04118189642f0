"""The optimiser side of a step: the LR schedule, and per minibatch backward (scaled under
fp16), gradient all-reduce, per-group norms, clipping and an AdamW step — skipped on overflow
or a non-finite norm."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from moescope.replay.batch import Batch
from moescope.replay.comm import Comm
from moescope.replay.config import ReplayConfig
from moescope.replay.faults import FaultPlan
from moescope.replay.instruments import grad_norms, parameter_groups
from moescope.replay.models import Models
from moescope.replay.precision import LossScaler
from moescope.replay.sums import StepSums


def lr_at(config: ReplayConfig, step: int) -> float:
    """The scheduled LR of ``step`` (linear warm-up, then constant or cosine to 10 %)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "cosine":
        span = max(1, config.steps - config.warmup_steps)
        progress = (step - config.warmup_steps) / span
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
    return config.lr


class Updater:
    """The policy's trainable parameters, their AdamW optimiser and the fp16 loss scaler."""

    def __init__(self, models: Models, config: ReplayConfig, faults: FaultPlan, comm: Comm) -> None:
        self.c, self.faults, self.comm = config, faults, comm
        self.device = next(models.policy.parameters()).device
        self.params = [p for p in models.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        self.scaler = LossScaler(
            config.precision, self.device, config.initial_loss_scale, sharded=comm.sharded
        )
        self.groups = parameter_groups(models.policy, models.moe)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def update(
        self, batch: Batch, loss_fn: Callable[[float], torch.Tensor], step: int, sums: StepSums
    ) -> None:
        """One update from ``batch``; ``loss_fn(tokens)`` gives its loss, normalised by the
        response tokens of the minibatch over all ranks."""
        tokens = float(self.comm.sum_(torch.tensor(float(batch.tokens), dtype=torch.float64)))
        self.optimizer.zero_grad(set_to_none=False)
        if batch.tokens:
            self.scaler.scale(loss_fn(max(tokens, 1.0))).backward()
        self.comm.sum_grads(self.params)
        self.scaler.unscale(self.optimizer)
        total, clip = self._clip(step, sums)
        sums.add("_grad_norm", total / self.comm.world)
        sums.add("_clip_coef", clip / self.comm.world)
        omitted = self.faults.get("update_omission", step) is not None
        if omitted:
            skipped = False
        elif self.c.skip_nonfinite and not math.isfinite(total) and not self.scaler.enabled:
            skipped = True
        else:
            skipped = self.scaler.step(self.optimizer)
        if self.c.instruments and not skipped and not omitted:
            square, count, steps = adam_step_sq(self.optimizer)
            sums.peak("_adam_steps", steps)
            sums.add("_update_sq", square / self.comm.world)
            sums.add("_update_n", count / self.comm.world)
        sums.add("_skipped", float(skipped) / self.comm.world)
        sums.add("_applied", float(not skipped and not omitted) / self.comm.world)

    def _clip(self, step: int, sums: StepSums) -> tuple[float, float]:
        """The total gradient norm and the clip coefficient applied (1: none)."""
        c, world = self.c, self.comm.world
        clip_on = self.faults.get("no_grad_clip", step) is None
        if not c.instruments:  # the bare step: one fused norm-and-clip, as a training framework does it
            limit = c.max_grad_norm if clip_on else math.inf
            total = float(torch.nn.utils.clip_grad_norm_(self.params, limit))
            return total, min(1.0, limit / (total + 1e-6)) if math.isfinite(total) else 1.0
        sq, total, bad = grad_norms(self.groups)
        for name, value in sq.items():
            sums.add(f"_gsq/{name}", value / world)  # equal on every rank after the all-reduce
        sums.add("nonfinite_grads", bad / world)
        clip = min(1.0, c.max_grad_norm / (total + 1e-6)) if clip_on and math.isfinite(total) else 1.0
        if clip < 1.0:
            torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], clip)
        return total, clip


@torch.no_grad()
def adam_step_sq(optimizer: torch.optim.Optimizer) -> tuple[float, float, float]:
    """The sum of squares of AdamW's last step per coordinate over the LR (``m̂ / (√v̂ + ε)``,
    weight decay aside) and the coordinate count, read from its state: 1 per coordinate on
    Adam's first step, well below once its moments have averaged noisy gradients, so a jump
    back to 1 mid-run is a state that was lost (the ``resume_state`` fault); and the largest
    step count in the state, which such a loss sets back. Under FSDP each rank holds a disjoint
    shard of the state: the local sums are added over ranks, so every rank has the whole
    model's figures."""
    from moescope.models.sharding import is_sharded, local, sum_over_shards

    total, count, steps, sharded = 0.0, 0.0, 0.0, False
    for group in optimizer.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state or "exp_avg" not in state:
                continue
            t = float(state["step"])
            steps = max(steps, t)
            sharded = sharded or is_sharded(state["exp_avg"])
            m = local(state["exp_avg"]) / (1 - beta1**t)
            v = local(state["exp_avg_sq"]) / (1 - beta2**t)
            total += float((m / (v.sqrt() + group["eps"])).float().square().sum())
            count += m.numel()
    if sharded:
        sums = sum_over_shards(torch.tensor([total, count], dtype=torch.float64))
        total, count = (float(x) for x in sums)
    return total, count, steps
