"""One trace record from a step's reduced sums: means over samples, tokens and minibatches,
the routing and token-entropy instruments, OPEFO's and PivotRL's counters."""

from __future__ import annotations

import math
from typing import Any

import torch

from moescope import schema as S
from moescope.replay.config import ReplayConfig
from moescope.replay.instruments import GROUPS, HIST_BINS, POSITION_BUCKETS
from moescope.replay.opefo import EntropyFlowControl


def step_metrics(
    t: dict[str, Any],
    config: ReplayConfig,
    *,
    lr: float,
    minibatches: int,
    loss_scale: float,
    opefo: EntropyFlowControl,
    vocab: int,
) -> dict[str, Any]:
    """The record of a step whose global sums are ``t`` (from :class:`~moescope.replay.sums.StepSums`)."""
    c, n_mb = config, minibatches
    rec = _core_metrics(t, c, lr, n_mb, loss_scale)
    if "kl" in t:
        rec[S.KL] = t["kl"] / n_mb
    for name in GROUPS:
        if f"_gsq/{name}" in t:
            rec[S.GRAD_NORM_GROUP + name] = math.sqrt(t[f"_gsq/{name}"] / n_mb)  # RMS over minibatches
    if "flip_tokens" in t:
        layers = t["flips"] / t["flip_tokens"].clamp(min=1)
        rec[S.ROUTING_FLIP_FRAC] = float(layers.mean())
        rec[S.ROUTING_FLIP_LAYERS] = layers.tolist()
    if "mismatch_tokens" in t:
        rec[S.LOGPROB_MISMATCH] = t["mismatch_sum"] / max(t["mismatch_tokens"], 1.0)
        rec[S.MISMATCH_KL] = t["mismatch_k3"] / max(t["mismatch_tokens"], 1.0)
        if "is_cut" in t:
            rec[S.IS_TRUNCATED_FRAC] = t["is_cut"] / max(t["mismatch_tokens"], 1.0)
        if "masked" in t:
            rec[S.MASKED_FRAC] = t["masked"] / max(t["mismatch_tokens"], 1.0)
        mean = t["is_ratio"] / max(t["mismatch_tokens"], 1.0)
        rec[S.IS_RATIO_MEAN] = mean
        rec[S.IS_RATIO_STD] = math.sqrt(
            max(t["is_ratio_sq"] / max(t["mismatch_tokens"], 1.0) - mean * mean, 0.0)
        )
    if t.get("route_slots"):
        rec[S.ROUTE_OVERLAP] = t["route_agree"] / t["route_slots"]
    if t.get("_update_n"):
        rec[S.UPDATE_RATIO] = math.sqrt(t["_update_sq"] / t["_update_n"])
        rec[S.OPTIMIZER_STEPS] = round(t["_adam_steps"])
    if c.aux_loss_coef > 0:
        rec[S.AUX_LOSS] = t.get("aux", 0.0) / n_mb
    if c.z_loss_coef > 0:
        rec[S.Z_LOSS] = t.get("z", 0.0) / n_mb
    rec.update(routing_metrics(t))
    if c.instruments:
        rec[S.TOKEN_ENTROPY] = entropy_record(t, vocab)
    if c.token_entropy_flow_control:
        rec[S.OPEFO_ACTIVE] = int(opefo.active)
        rec[S.OPEFO_COEF] = opefo.coef
        rec[S.OPEFO_DAMPED] = t.get("damped", 0.0) / max(t.get("tokens", 0.0), 1.0)
    if c.pivot:
        rec[S.PIVOT_SAMPLED] = round(t.get("pivot_sampled", 0.0))
        rec[S.PIVOT_KEPT] = round(t.get("pivot_kept", 0.0))
    return rec


def _core_metrics(
    t: dict[str, Any], c: ReplayConfig, lr: float, n_mb: int, loss_scale: float
) -> dict[str, Any]:
    """Loss, gradient, reward and response metrics every step records."""
    n, tokens = max(t.get("samples", 0.0), 1.0), max(t.get("tokens", 0.0), 1.0)
    mean = t.get("reward_sum", 0.0) / n
    var = max(t.get("reward_sq", 0.0) / n - mean * mean, 0.0)
    return {
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
        S.LOSS_SCALE: loss_scale,
        S.SKIPPED: round(t["_skipped"]),
        S.CLIP_COEF: t["_clip_coef"] / n_mb,
        S.UPDATE_APPLIED: round(t["_applied"]),
        S.NONFINITE: round(t.get("nonfinite_grads", 0.0)) + round(t.get("nonfinite_loss", 0.0))
        if c.instruments
        else int(not math.isfinite(t["_grad_norm"])) + round(t.get("nonfinite_loss", 0.0)),
    }


def routing_metrics(t: dict[str, Any]) -> dict[str, Any]:
    """Expert load, its spread, router entropy, top-k margin and largest logit from the routing
    sums (``_r/...``) of a step's passes on every rank (the largest logit their peak)."""
    if "_r/counts" not in t:
        return {}
    counts, ent, tok = t["_r/counts"], t["_r/entropy_sum"], t["_r/tokens"].clamp(min=1)
    shares = counts / counts.sum(1, keepdim=True).clamp(min=1)
    mean = shares.mean(1, keepdim=True)
    cv = (shares.std(1, unbiased=False, keepdim=True) / mean.clamp(min=1e-12)).mean()
    margins = t["_r/margin_sum"] / t["_r/margin_tokens"].clamp(min=1)
    return {
        S.EXPERT_LOAD: shares.tolist(),
        S.TOPK_MARGIN: float(margins.mean()),
        S.TOPK_MARGIN_LAYERS: margins.tolist(),
        S.LOAD_CV: float(cv),
        S.MAX_LOAD_SHARE: float(shares.max()),
        S.DEAD_EXPERTS: int((counts == 0).sum()),
        S.ROUTER_ENTROPY: float((ent / tok).mean()),
        S.ROUTER_LOGIT_MAX: t["_r/max_logit"],
    }


def entropy_record(t: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Token entropy by response position bucket, and its histogram, from the summed
    ``_te/...`` sums of :func:`~moescope.replay.instruments.entropy_summary`."""
    nb = len(POSITION_BUCKETS)
    sums = t.get("_te/bucket_sum", torch.zeros(nb)).tolist()
    counts = t.get("_te/bucket_count", torch.zeros(nb)).tolist()
    hist = t.get("_te/hist", torch.zeros(HIST_BINS)).tolist()
    top = math.log(vocab)
    return {
        "position_buckets": [[lo, hi if hi < 1 << 29 else None] for lo, hi in POSITION_BUCKETS],
        "bucket_mean": [s / n if n else None for s, n in zip(sums, counts, strict=True)],
        "bucket_tokens": [round(n) for n in counts],
        "hist_edges": [top * i / HIST_BINS for i in range(HIST_BINS + 1)],
        "hist": [round(h) for h in hist],
    }
