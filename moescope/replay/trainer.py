"""The replay loop: rollout, advantages, PPO-clip updates, instrumentation, one trace line a step.

One RL step:

1. take the step's prompts (:mod:`~moescope.replay.data`), sample G completions per prompt (or
   PivotRL pivots) and score them;
2. compute group advantages (GRPO or GEPO);
3. with no gradient, compute old log-probs (training precision, or the rollout's under the
   ``rollout_logprob_precision`` fault), the reference's log-probs and the token entropy that
   drives OPEFO;
4. split the groups into ``minibatches``; for each, one forward with router and non-finite
   watches, the loss, backward (scaled under fp16), gradient all-reduce, per-group norms,
   clipping, and an AdamW step — skipped on overflow or a non-finite norm;
5. reduce every metric over ranks and append the step to the trace (rank 0).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from moescope import schema as S
from moescope.errors import MoescopeError
from moescope.models.arch import MoEModel, adapt
from moescope.models.looping import apply_loop, loop_times_of
from moescope.replay import instruments as ins
from moescope.replay.advantages import advantages as group_advantages
from moescope.replay.batch import Batch, pack, token_logprobs
from moescope.replay.comm import Comm
from moescope.replay.config import ReplayConfig
from moescope.replay.faults import FaultPlan
from moescope.replay.losses import k3_kl, load_balancing, masked_sum, ppo_clip, z_loss
from moescope.replay.opefo import EntropyFlowControl
from moescope.replay.precision import LossScaler, rounded_router
from moescope.replay.rewards import RewardFn
from moescope.replay.rollout import Group, rollout_groups
from moescope.replay.sums import StepSums

TIMING_KEYS = ("time/rollout_s", "time/update_s", "time/step_s")
"""Trace fields that measure wall time; everything else is deterministic on CPU."""


@dataclass
class Models:
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    tokenizer: Any
    moe: MoEModel
    loop_times: int


def prepare_models(
    policy: torch.nn.Module, reference: torch.nn.Module | None, tokenizer: Any, loop_times: int
) -> Models:
    """Adapt (before looping, so hooks sit once per physical layer), loop, set eval mode."""
    moe = adapt(policy)
    for m in (policy, reference):
        if m is not None:
            if loop_times > 1:
                apply_loop(m, loop_times)
            m.eval()  # deterministic routing, no dropout; gradients still flow
    if reference is not None:
        reference.requires_grad_(False)
    if tokenizer is None:
        raise MoescopeError(
            "Replay needs a tokenizer to sample text; pass tokenizer= or a checkpoint that ships one."
        )
    return Models(policy, reference, tokenizer, moe, loop_times)


def lr_at(config: ReplayConfig, step: int) -> float:
    """The scheduled LR of ``step`` (linear warm-up, then constant or cosine to 10 %)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.lr_schedule == "cosine":
        span = max(1, config.steps - config.warmup_steps)
        progress = (step - config.warmup_steps) / span
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
    return config.lr


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
        self.m, self.c, self.schedule, self.reward_fn = models, config, schedule, reward_fn
        self.max_new_tokens, self.comm = max_new_tokens, comm
        self.device = next(models.policy.parameters()).device
        self.params = [p for p in models.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        self.scaler = LossScaler(config.precision, self.device, config.initial_loss_scale)
        self.opefo = EntropyFlowControl(
            config.min_entropy_floor,
            config.entropy_coef_max,
            config.low_entropy_damping,
            enabled=config.token_entropy_flow_control,
        )
        self.faults = FaultPlan(config.faults, precision=config.precision, steps=config.steps)
        self.groups = ins.parameter_groups(models.policy, models.moe)
        self.routers = [(layer.router, layer.router_weight) for layer in models.moe.layers]
        self.vocab = models.policy.get_output_embeddings().weight.shape[0]

    # --- state for checkpoints -----------------------------------------------------------------

    def state(self, next_step: int) -> dict[str, Any]:
        return {
            "next_step": next_step,
            "config_digest": self.c.digest(),
            "scaler": {
                k: (v if not torch.is_tensor(v) else v.item()) for k, v in self.scaler.state_dict().items()
            },
            "opefo": self.opefo.state_dict(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state.get("scaler") or {})
        self.opefo.load_state_dict(state["opefo"])

    # --- one step ------------------------------------------------------------------------------

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        c, sums = self.c, StepSums()
        examples = list(self.schedule[step])
        chunks = _minibatch_positions(len(examples), min(c.minibatches, len(examples)))
        mine = [self.comm.mine(chunk) for chunk in chunks]
        fault = self.faults.get
        groups = self._rollout(step, examples, [g for ch in mine for g in ch], sums)
        t_rollout = time.perf_counter() - t0
        batches = [self._pack(groups, ch) for ch in mine]
        with self._step_faults(step) as watch:
            prepared = [self._no_grad_pass(b, step, sums) for b in batches]
            ent = sums.reduce(self.comm)
            self.opefo.enabled = c.token_entropy_flow_control and fault("entropy_control_off", step) is None
            self.opefo.observe(ent["_old_entropy"] / max(ent["_old_tokens"], 1.0))
            spike = fault("lr_spike", step)
            lr = lr_at(c, step) * (spike.arg if spike else 1.0)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            if (f := fault("fp16_overflow", step)) is not None:
                self.scaler.multiply(f.arg)
            t1 = time.perf_counter()
            for batch, extra in zip(batches, prepared, strict=True):
                self._update(batch, extra, step, sums)
            t_update = time.perf_counter() - t1
        totals = sums.reduce(self.comm)
        record = self._metrics(totals, step, lr, len(chunks))
        record[S.FIRST_NONFINITE_MODULE] = self.comm.first_text(watch.first_module)
        record["faults/active"] = self.faults.active_names(step)
        record["time/rollout_s"], record["time/update_s"] = t_rollout, t_update
        record["time/step_s"] = time.perf_counter() - t0
        return record

    @contextmanager
    def _step_faults(self, step: int):
        """Install this step's faults of the trainer's forward passes; yield the non-finite watch.

        The rollout engine stays clean: a NaN there would stop sampling itself, while the
        failures replayed here are those of the training side.
        """
        with ExitStack() as stack:
            nan = self.faults.get("nan_op", step)
            if nan is not None:
                stack.enter_context(_nan_output(self.m.policy, nan.arg or self._default_nan_module()))
            self._watch = ins.NonfiniteWatch()
            yield self._watch

    def _attribute(self, out: Any, batch: Batch, step: int) -> None:
        """When a training forward's logits are not finite, find the first module that went so.

        The forward is deterministic, so it is run once more (no gradient) with a hook on every
        module; healthy steps pay one ``isfinite`` on the logits and nothing else.
        """
        if not self.c.instruments or self._watch.first_module is not None:
            return
        if bool(torch.isfinite(out.logits).all()):
            return
        with torch.no_grad(), ins.watch_nonfinite(self.m.policy) as watch, self._training_forward(step):
            token_logprobs(self.m.policy, batch, temperature=self.c.temperature, precision=self.c.precision)
        self._watch.first_module = watch.first_module

    def _default_nan_module(self) -> str:
        experts = self.m.moe.layers[-1].experts
        return next(name for name, mod in self.m.policy.named_modules() if mod is experts)

    def _training_forward(self, step: int):
        """Context of a training forward: precision, plus the router_precision fault."""
        stack = ExitStack()
        rp = self.faults.get("router_precision", step)
        if rp is not None:
            stack.enter_context(rounded_router(self.routers, rp.arg))
        return stack

    # rollout ---------------------------------------------------------------------------------

    def _rollout(
        self, step: int, examples: list, positions: list[int], sums: StepSums
    ) -> dict[int, list[Group]]:
        c = self.c
        policy, tok = self.m.policy, self.m.tokenizer
        if c.pivot:
            from moescope.replay.pivot import pivot_groups

            by_pos = pivot_groups(self, step, [(g, examples[g]) for g in positions], sums)
        else:
            made = rollout_groups(
                policy,
                tok,
                [(g, examples[g]) for g in positions],
                self.reward_fn,
                step=step,
                seed=c.seed,
                group_size=c.group_size,
                max_new_tokens=self.max_new_tokens,
                temperature=c.temperature,
                top_p=c.top_p,
                precision=c.rollout_dtype_name,
            )
            by_pos = {g.index: [g] for g in made}
        scale = self.faults.get("reward_scale", step)
        for gs in by_pos.values():
            for g in gs:
                if scale is not None:
                    g.rewards = [r * scale.arg for r in g.rewards]
                r = torch.tensor(g.rewards, dtype=torch.float64)
                sums.add("reward_sum", r.sum())
                sums.add("reward_sq", (r * r).sum())
                sums.add("samples", len(g.rewards))
                sums.add("length_sum", sum(len(x) for x in g.responses))
                sums.add("truncated", sum(g.truncated))
                sums.add("groups", 1)
                sums.add("groups_no_signal", float(r.max() == r.min()))
        return by_pos

    def _pack(self, by_pos: dict[int, list[Group]], positions: list[int]) -> Batch:
        groups = [g for pos in positions for g in by_pos.get(pos, [])]
        advs: list[float] = []
        for g in groups:
            rewards = torch.tensor([g.rewards])
            advs += group_advantages(rewards, gepo=self.c.gepo, threshold=self.c.difficulty_threshold)[
                0
            ].tolist()
        return pack(groups, advs, self.m.tokenizer.pad_token_id)

    # no-grad pass: old, reference and rollout log-probs --------------------------------------

    @torch.no_grad()
    def _no_grad_pass(self, batch: Batch, step: int, sums: StepSums) -> dict[str, torch.Tensor]:
        c, out = self.c, {}
        if not len(batch.input_ids):
            return out
        mask = batch.response_mask
        with self._training_forward(step):
            old, ent, raw = token_logprobs(
                self.m.policy, batch, temperature=c.temperature, precision=c.precision
            )
        self._attribute(raw, batch, step)
        out["old"], out["old_entropy"] = old, ent
        sums.add("_old_entropy", masked_sum(ent, mask))
        sums.add("_old_tokens", mask.sum())
        low = self.faults.get("rollout_logprob_precision", step)
        rollout_prec = low.arg if low is not None else c.rollout_dtype_name
        if rollout_prec != c.precision or self.faults.get("router_precision", step) is not None:
            roll, _, _ = token_logprobs(
                self.m.policy, batch, temperature=c.temperature, precision=rollout_prec
            )
            sums.add("mismatch_sum", masked_sum((roll - old).abs().nan_to_num(0.0), mask))
            sums.add("mismatch_tokens", mask.sum())
            if low is not None:
                out["old"] = roll
        if self.m.reference is not None:
            ref, _, _ = token_logprobs(
                self.m.reference, batch, temperature=c.temperature, precision=c.precision
            )
            out["ref"] = ref
        return out

    # update ----------------------------------------------------------------------------------

    def _update(self, batch: Batch, extra: dict[str, torch.Tensor], step: int, sums: StepSums) -> None:
        c, comm = self.c, self.comm
        tokens = float(comm.sum_(torch.tensor(float(batch.tokens), dtype=torch.float64)))
        self.optimizer.zero_grad(set_to_none=False)
        if batch.tokens:
            loss = self._loss(batch, extra, step, sums, max(tokens, 1.0))
            self.scaler.scale(loss).backward()
        comm.sum_grads(self.params)
        self.scaler.unscale(self.optimizer)
        clip_on = self.faults.get("no_grad_clip", step) is None
        if c.instruments:
            sq, total, bad = ins.grad_norms(self.groups)
            for name, value in sq.items():
                sums.add(f"_gsq/{name}", value / comm.world)  # equal on every rank after the all-reduce
            sums.add("nonfinite_grads", bad / comm.world)
            clip = min(1.0, c.max_grad_norm / (total + 1e-6)) if clip_on and math.isfinite(total) else 1.0
            if clip < 1.0:
                torch._foreach_mul_([p.grad for p in self.params if p.grad is not None], clip)
        else:  # the bare step: one fused norm-and-clip, as a training framework does it
            limit = c.max_grad_norm if clip_on else math.inf
            total = float(torch.nn.utils.clip_grad_norm_(self.params, limit))
            clip = min(1.0, limit / (total + 1e-6)) if math.isfinite(total) else 1.0
        sums.add("_grad_norm", total / comm.world)
        sums.add("_clip_coef", clip / comm.world)
        omitted = self.faults.get("update_omission", step) is not None
        if omitted:
            skipped = False
        elif c.skip_nonfinite and not math.isfinite(total) and not self.scaler.enabled:
            skipped = True
        else:
            skipped = self.scaler.step(self.optimizer)
        sums.add("_skipped", float(skipped) / comm.world)
        sums.add("_applied", float(not skipped and not omitted) / comm.world)

    def _loss(
        self, batch: Batch, extra: dict[str, torch.Tensor], step: int, sums: StepSums, tokens: float
    ) -> torch.Tensor:
        c, m = self.c, self.m
        mask = batch.response_mask
        aux_on = c.aux_loss_coef > 0 and self.faults.get("aux_loss_off", step) is None
        watch_routers = c.instruments or aux_on or c.z_loss_coef > 0
        with ins.record_routers(m.moe, enabled=watch_routers) as routers, self._training_forward(step):
            logp, ent, raw = token_logprobs(m.policy, batch, temperature=c.temperature, precision=c.precision)
        self._attribute(raw, batch, step)
        adv = batch.advantages[:, None].expand_as(logp)
        adv, damped = self.opefo.damp(adv, extra["old_entropy"], mask)
        pg, clipped = ppo_clip(logp, extra["old"], adv, c.clip_low, c.clip_high)
        pg_loss = masked_sum(pg, mask) / tokens
        ent_mean = masked_sum(ent, mask) / tokens
        loss = pg_loss - self.opefo.coef * ent_mean
        if "ref" in extra:
            kl = masked_sum(k3_kl(logp, extra["ref"]), mask) / tokens
            loss = loss + c.kl_beta * kl
            sums.add("kl", kl.detach())
        valid = batch.attention_mask.reshape(-1).bool()
        share = float(valid.sum()) / float(self.comm.sum_(torch.tensor(float(valid.sum()))))
        if routers.logits:
            logits = [lg[valid] for lg in routers.logits]
            index = [ix[valid] for ix in routers.index]
            if aux_on:
                probs = [torch.softmax(lg.float(), -1) for lg in logits]
                aux = load_balancing(probs, index, m.moe.num_experts)
                loss = loss + c.aux_loss_coef * aux * share
                sums.add("aux", aux.detach() * share)
            if c.z_loss_coef > 0:
                z = z_loss(logits)
                loss = loss + c.z_loss_coef * z * share
                sums.add("z", z.detach() * share)
            if c.instruments:
                rs = ins.routing_sums(routers, valid, len(m.moe.layers), m.moe.num_experts)
                for key in ("counts", "entropy_sum", "tokens"):
                    sums.add(f"_r/{key}", rs[key])
                sums.add("_r/max_logit_sum", rs["max_logit"])
        with torch.no_grad():
            sums.add("loss", loss.detach())
            sums.add("pg_loss", pg_loss.detach())
            sums.add("entropy", ent_mean.detach())
            sums.add("clipped", masked_sum(clipped, mask))
            sums.add("tokens", mask.sum())
            sums.add("ppo_kl", masked_sum(extra["old"] - logp, mask))
            sums.add("damped", damped * float(mask.sum()))
            sums.add("nonfinite_loss", float(not torch.isfinite(loss)))
            if c.instruments:
                for key, values in ins.entropy_summary(ent, mask, batch.positions, self.vocab).items():
                    sums.add(f"_te/{key}", torch.tensor(values, dtype=torch.float64))
        return loss

    # metrics ---------------------------------------------------------------------------------

    def _metrics(self, t: dict[str, float], step: int, lr: float, n_mb: int) -> dict[str, Any]:
        c = self.c
        n, tokens = max(t.get("samples", 0.0), 1.0), max(t.get("tokens", 0.0), 1.0)
        mean = t.get("reward_sum", 0.0) / n
        var = max(t.get("reward_sq", 0.0) / n - mean * mean, 0.0)
        rec: dict[str, Any] = {
            S.ACTOR_LOSS: t.get("loss", 0.0) / n_mb,
            S.PG_LOSS: t.get("pg_loss", 0.0) / n_mb,
            S.GRAD_NORM: t["_grad_norm"] / n_mb,
            S.ENTROPY: t.get("entropy", 0.0) / n_mb,
            S.CLIPFRAC: t.get("clipped", 0.0) / tokens,
            S.PPO_KL: t.get("ppo_kl", 0.0) / tokens,
            S.REWARD_MEAN: mean,
            S.REWARD_STD: math.sqrt(var),
            S.LENGTH_MEAN: t.get("length_sum", 0.0) / n,
            S.TRUNCATED_FRAC: t.get("truncated", 0.0) / n,
            S.NO_SIGNAL_FRAC: t.get("groups_no_signal", 0.0) / max(t.get("groups", 0.0), 1.0),
            S.LR: lr,
            S.LOSS_SCALE: self.scaler.value,
            S.SKIPPED: round(t["_skipped"]),
            "optim/clip_coef": t["_clip_coef"] / n_mb,
            "actor/update_applied": round(t["_applied"]),
            S.NONFINITE: round(t.get("nonfinite_grads", 0.0)) + round(t.get("nonfinite_loss", 0.0))
            if c.instruments
            else int(not math.isfinite(t["_grad_norm"])) + round(t.get("nonfinite_loss", 0.0)),
        }
        if "kl" in t:
            rec[S.KL] = t["kl"] / n_mb
        for name in ins.GROUPS:
            if f"_gsq/{name}" in t:
                rec[S.GRAD_NORM_GROUP + name] = math.sqrt(t[f"_gsq/{name}"] / n_mb)  # RMS over minibatches
        if "mismatch_tokens" in t:
            rec["rollout/logprob_mismatch"] = t["mismatch_sum"] / max(t["mismatch_tokens"], 1.0)
        if c.aux_loss_coef > 0:
            rec[S.AUX_LOSS] = t.get("aux", 0.0) / n_mb
        if c.z_loss_coef > 0:
            rec[S.Z_LOSS] = t.get("z", 0.0) / n_mb
        rec.update(self._routing_metrics(t, n_mb))
        if c.instruments:
            rec[S.TOKEN_ENTROPY] = _entropy_record(t, self.vocab)
        if c.token_entropy_flow_control:
            rec["opefo/active"] = int(self.opefo.active)
            rec["opefo/entropy_coef"] = self.opefo.coef
            rec["opefo/damped_frac"] = t.get("damped", 0.0) / tokens
        if c.pivot:
            rec["pivot/sampled"] = round(t.get("pivot_sampled", 0.0))
            rec["pivot/kept"] = round(t.get("pivot_kept", 0.0))
        return rec

    def _routing_metrics(self, t: dict[str, Any], n_mb: int) -> dict[str, Any]:
        if "_r/counts" not in t:
            return {}
        counts, ent, tok = t["_r/counts"], t["_r/entropy_sum"], t["_r/tokens"].clamp(min=1)
        shares = counts / counts.sum(1, keepdim=True).clamp(min=1)
        mean = shares.mean(1, keepdim=True)
        cv = (shares.std(1, unbiased=False, keepdim=True) / mean.clamp(min=1e-12)).mean()
        return {
            S.EXPERT_LOAD: shares.tolist(),
            S.LOAD_CV: float(cv),
            S.MAX_LOAD_SHARE: float(shares.max()),
            S.DEAD_EXPERTS: int((counts == 0).sum()),
            S.ROUTER_ENTROPY: float((ent / tok).mean()),
            "moe/router_logit_max": t["_r/max_logit_sum"] / (n_mb * self.comm.world),
        }


def _entropy_record(t: dict[str, Any], vocab: int) -> dict[str, Any]:
    nb = len(ins.POSITION_BUCKETS)
    sums = t.get("_te/bucket_sum", torch.zeros(nb)).tolist()
    counts = t.get("_te/bucket_count", torch.zeros(nb)).tolist()
    hist = t.get("_te/hist", torch.zeros(ins.HIST_BINS)).tolist()
    top = math.log(vocab)
    return {
        "position_buckets": [[lo, hi if hi < 1 << 29 else None] for lo, hi in ins.POSITION_BUCKETS],
        "bucket_mean": [s / n if n else None for s, n in zip(sums, counts, strict=True)],
        "bucket_tokens": [round(n) for n in counts],
        "hist_edges": [top * i / ins.HIST_BINS for i in range(ins.HIST_BINS + 1)],
        "hist": [round(h) for h in hist],
    }


def _minibatch_positions(n: int, minibatches: int) -> list[list[int]]:
    """Prompt positions of each minibatch: contiguous, as even as possible."""
    bounds = [round(i * n / minibatches) for i in range(minibatches + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(minibatches)]


@contextmanager
def _nan_output(model: torch.nn.Module, module_name: str):
    """Write NaN into the output of ``module_name`` (the ``nan_op`` fault)."""
    modules = dict(model.named_modules())
    if module_name not in modules:
        near = [n for n in modules if n.endswith(module_name.split(".")[-1])][:3]
        raise MoescopeError(
            f"nan_op names module {module_name!r}, which this model does not have"
            + (f"; did you mean {', '.join(near)}?" if near else "; see model.named_modules().")
        )

    def hook(module, args, out):
        return _poison(out)

    handle = modules[module_name].register_forward_hook(hook)
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


def reference_copy(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen deep copy of the policy (the reference when no ``ref_model_path`` is given)."""
    ref = copy.deepcopy(policy)
    ref.requires_grad_(False)
    return ref


def model_loop_times(config: ReplayConfig, model_config: Any) -> int:
    return config.loop_times or loop_times_of(model_config)
