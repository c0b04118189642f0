"""The loss of one minibatch: PPO-clip with OPEFO's damping and entropy bonus, the KL to the
reference and the router losses, plus the step sums the metrics are made of (instruments
included)."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from moescope.replay.batch import Batch
from moescope.replay.comm import Comm
from moescope.replay.forward import TrainingForward
from moescope.replay.instruments import RouterRecord, entropy_summary, record_routers, routing_sums
from moescope.replay.losses import gspo_clip, k3_kl, load_balancing, masked_sum, ppo_clip, z_loss
from moescope.replay.opefo import EntropyFlowControl
from moescope.replay.router_replay import RouteOverlap, replayed_routing
from moescope.replay.sums import StepSums


class Objective:
    """The replay's loss, built on the trainer's forward passes."""

    def __init__(self, forward: TrainingForward, opefo: EntropyFlowControl, comm: Comm, vocab: int) -> None:
        self.forward, self.opefo, self.comm, self.vocab = forward, opefo, comm, vocab

    def loss(
        self, batch: Batch, extra: dict[str, torch.Tensor], step: int, sums: StepSums, tokens: float
    ) -> torch.Tensor:
        """The minibatch's loss, normalised by ``tokens`` (response tokens over all ranks)."""
        fwd, c, m = self.forward, self.forward.c, self.forward.m
        mask = batch.response_mask
        aux_on = c.aux_loss_coef > 0 and fwd.faults.get("aux_loss_off", step) is None
        doubled = fwd.faults.get("aux_loss_double", step) is not None  # counted twice (recompute)
        aux_times = (2.0 if doubled else 1.0) if aux_on else 0.0
        watch_routers = c.instruments or aux_on or c.z_loss_coef > 0
        overlap = RouteOverlap(batch.attention_mask.reshape(-1).bool())
        replay = replayed_routing(m.moe, extra["route"], overlap) if "route" in extra else nullcontext()
        with record_routers(m.moe, enabled=watch_routers) as routers, fwd.context(step), replay:
            logp, ent, raw = fwd.logprobs(m.policy, batch, packed=fwd.packed(step))
        if overlap.slots:
            sums.add("route_agree", overlap.agree)
            sums.add("route_slots", overlap.slots)
        fwd.attribute(raw, batch, step)
        adv = batch.advantages[:, None].expand_as(logp)
        adv, damped = self.opefo.damp(adv, extra["old_entropy"], mask)
        if c.algo == "gspo":
            pg, clipped = gspo_clip(logp, extra["old"], adv, mask, c.seq_clip_low, c.seq_clip_high)
        else:
            pg, clipped = ppo_clip(logp, extra["old"], adv, c.clip_low, c.clip_high)
        if "is_weight" in extra:  # importance-sampling correction of the rollout's samples
            pg = pg * extra["is_weight"]
        pg_loss = masked_sum(pg, mask) / tokens
        ent_mean = masked_sum(ent, mask) / tokens
        loss = pg_loss - self.opefo.coef * ent_mean
        if "ref" in extra:
            kl = masked_sum(k3_kl(logp, extra["ref"]), mask) / tokens
            loss = loss + c.kl_beta * kl
            sums.add("kl", kl.detach())
        loss = self._router_terms(loss, routers, batch, aux_times, sums)
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
                for key, values in entropy_summary(ent, mask, batch.positions, self.vocab).items():
                    sums.add(f"_te/{key}", torch.tensor(values, dtype=torch.float64))
        return loss

    def _router_terms(
        self, loss: torch.Tensor, routers: RouterRecord, batch: Batch, aux_times: float, sums: StepSums
    ) -> torch.Tensor:
        """``loss`` plus the load-balancing loss counted ``aux_times`` times (0: off; 2: the
        aux_loss_double fault) and the z loss (weighted by this rank's share of the tokens); the
        routing instruments' sums."""
        c, moe = self.forward.c, self.forward.m.moe
        valid = batch.attention_mask.reshape(-1).bool()
        share = float(valid.sum()) / float(self.comm.sum_(torch.tensor(float(valid.sum()))))
        if not routers.logits:
            return loss
        if routers.logits[0].shape[0] != valid.numel():  # a packed pass: real tokens only
            valid = valid.new_ones(routers.logits[0].shape[0])
        logits = [lg[valid] for lg in routers.logits]
        index = [ix[valid] for ix in routers.index]
        if aux_times:
            probs = [torch.softmax(lg.float(), -1) for lg in logits]
            aux = aux_times * load_balancing(probs, index, moe.num_experts)
            loss = loss + c.aux_loss_coef * aux * share
            sums.add("aux", aux.detach() * share)
        if c.z_loss_coef > 0:
            z = z_loss(logits)
            loss = loss + c.z_loss_coef * z * share
            sums.add("z", z.detach() * share)
        if c.instruments:
            rs = routing_sums(routers, valid, moe)
            for key in ("counts", "entropy_sum", "tokens", "margin_sum", "margin_tokens"):
                sums.add(f"_r/{key}", rs[key])
            sums.peak("_r/max_logit", rs["max_logit"])
        return loss
