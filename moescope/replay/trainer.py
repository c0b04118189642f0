"""The replay loop: rollout, advantages, PPO-clip updates, instrumentation, one trace line a step.

One RL step:

1. take the step's prompts (:mod:`~moescope.replay.data`), sample G completions per prompt (or
   PivotRL pivots) and score them (:mod:`~moescope.replay.sampling`);
2. compute group advantages (GRPO or GEPO);
3. with no gradient, compute old log-probs (training precision, or the rollout's under the
   ``rollout_logprob_precision`` fault), the reference's log-probs and the token entropy that
   drives OPEFO (:mod:`~moescope.replay.forward`);
4. split the groups into ``minibatches``; for each, one forward with router and non-finite
   watches, the loss (:mod:`~moescope.replay.objective`), backward (scaled under fp16), gradient
   all-reduce, per-group norms, clipping, and an AdamW step — skipped on overflow or a
   non-finite norm (:mod:`~moescope.replay.update`);
5. reduce every metric over ranks and append the step to the trace (rank 0;
   :mod:`~moescope.replay.metrics`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import torch

from moescope import schema as S
from moescope.replay.comm import Comm
from moescope.replay.config import ReplayConfig
from moescope.replay.faults import FaultPlan
from moescope.replay.forward import TrainingForward
from moescope.replay.metrics import step_metrics
from moescope.replay.models import Models
from moescope.replay.objective import Objective
from moescope.replay.opefo import EntropyFlowControl
from moescope.replay.rewards import RewardFn
from moescope.replay.rollout import Sampler
from moescope.replay.sampling import pack_groups, step_groups
from moescope.replay.sums import StepSums
from moescope.replay.update import Updater, lr_at

TIMING_KEYS = S.TIMING_KEYS


class Trainer:
    """State of one replay: models, optimiser, loss scaler, OPEFO and fault plan."""

    def __init__(
        self,
        models: Models,
        config: ReplayConfig,
        schedule: Sequence[Sequence[Any]],
        reward_fn: RewardFn,
        max_new_tokens: int,
        comm: Comm,
    ) -> None:
        self.m, self.c, self.schedule, self.comm = models, config, schedule, comm
        self.faults = FaultPlan(config.faults, precision=config.precision, steps=config.steps)
        self.updater = Updater(models, config, self.faults, comm)
        self.opefo = EntropyFlowControl(
            config.min_entropy_floor,
            config.entropy_coef_max,
            config.low_entropy_damping,
            enabled=config.token_entropy_flow_control,
        )
        self.vocab = models.policy.get_output_embeddings().weight.shape[0]
        self.sampler = Sampler(
            models.policy, models.tokenizer, reward_fn, config, max_new_tokens, synced=comm.sharded
        )
        self.forward = TrainingForward(models, config, self.faults, comm)
        self.objective = Objective(self.forward, self.opefo, comm, self.vocab)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.updater.optimizer

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self.updater.params

    # --- state for checkpoints -----------------------------------------------------------------

    def state(self, next_step: int) -> dict[str, Any]:
        scaler = self.updater.scaler.state_dict()
        return {
            "next_step": next_step,
            "config_digest": self.c.digest(),
            "scaler": {k: (v if not torch.is_tensor(v) else v.item()) for k, v in scaler.items()},
            "opefo": self.opefo.state_dict(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.updater.scaler.load_state_dict(state.get("scaler") or {})
        self.opefo.load_state_dict(state["opefo"])

    # --- one step ------------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, Any]:
        """Run RL step ``step`` and return its trace record."""
        t0 = time.perf_counter()
        sums = StepSums()
        examples = list(self.schedule[step])
        chunks = _minibatch_positions(len(examples), min(self.c.minibatches, len(examples)))
        mine = [self.comm.mine(chunk) for chunk in chunks]
        with self.forward.rollout_context(step):
            groups = step_groups(
                self.sampler, step, examples, [g for ch in mine for g in ch], self.faults, sums
            )
        t_rollout = time.perf_counter() - t0
        batches = [pack_groups(groups, ch, self.c, self.m.tokenizer.pad_token_id) for ch in mine]
        with self.forward.step_faults(step) as watch:
            prepared = [self.forward.old_logprobs(b, step, sums, i) for i, b in enumerate(batches)]
            self.forward.end_step()
            lr = self._before_updates(step, sums)
            t1 = time.perf_counter()
            for batch, extra in zip(batches, prepared, strict=True):
                loss_fn = functools.partial(self.objective.loss, batch, extra, step, sums)  # of the tokens
                self.updater.update(batch, loss_fn, step, sums)
            t_update = time.perf_counter() - t1
        record = step_metrics(
            sums.reduce(self.comm),
            self.c,
            lr=lr,
            minibatches=len(chunks),
            loss_scale=self.updater.scaler.value,
            opefo=self.opefo,
            vocab=self.vocab,
        )
        record[S.FIRST_NONFINITE_MODULE] = self.comm.first_text(watch.first_module)
        record[S.FAULTS_ACTIVE] = self.faults.active_names(step)
        record[S.TIME_ROLLOUT], record[S.TIME_UPDATE] = t_rollout, t_update
        record[S.TIME_STEP] = time.perf_counter() - t0
        return record

    def _before_updates(self, step: int, sums: StepSums) -> float:
        """OPEFO observes the old entropy; this step's LR and loss-scale faults are set. The LR."""
        fault = self.faults.get
        ent = sums.reduce(self.comm)
        self.opefo.enabled = self.c.token_entropy_flow_control and fault("entropy_control_off", step) is None
        self.opefo.observe(ent["_old_entropy"] / max(ent["_old_tokens"], 1.0))
        spike = fault("lr_spike", step)
        lr = lr_at(self.c, step) * (spike.arg if spike else 1.0)
        self.updater.set_lr(lr)
        if (f := fault("fp16_overflow", step)) is not None:
            self.updater.scaler.multiply(f.arg)
        if fault("resume_state", step) is not None:  # resumed with the weights but not AdamW's state
            self.updater.optimizer.state.clear()
        return lr


def _minibatch_positions(n: int, minibatches: int) -> list[list[int]]:
    """Prompt positions of each minibatch: contiguous, as even as possible."""
    bounds = [round(i * n / minibatches) for i in range(minibatches + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(minibatches)]
