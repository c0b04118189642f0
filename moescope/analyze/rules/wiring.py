"""Wiring faults a trainer's own log shows: routing replay fed the wrong routes, an optimizer
that lost its state, a load-balancing loss counted twice.

- ``route_overlap_low``: under routing replay, ``rollout/route_overlap`` (the share of replayed
  expert choices the trainer's own router also makes) below ``ROUTE_OVERLAP_LOW`` on ``SUSTAIN``
  records in a row (every record of a shorter excerpt). A rollout engine in another precision
  leaves a few per cent of choices different, which is what replay is for; routes shifted by a
  token, or replayed from another step (verl#4562, miles#407), share little more than chance.
  The frameworks' own check (miles PR 25) compares the same two.
- ``optimizer_reset``: ``optim/state_steps``, the updates the optimizer's state has counted,
  goes back while the run goes on: a resume that restored the weights but not the optimizer
  (slime#1695). ``optim/update_ratio`` at that step is evidence: Adam's first step moves every
  coordinate by the full learning rate.
- ``aux_loss_doubled``: ``moe/aux_loss`` jumps to ``AUX_DOUBLE`` times its previous record
  (within ``AUX_DOUBLE_TOL``) and stays there, while the expert load's CV moves by less than
  ``LOAD_STEADY``: the loss is counted twice (Megatron-LM#1330 under activation recompute, or a
  trainer that adds the model's own aux loss to its own), not a router that unbalanced.
"""

from __future__ import annotations

import itertools

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.rules.series import series, throughout
from moescope.analyze.rules.thresholds import (
    AUX_DOUBLE,
    AUX_DOUBLE_TOL,
    LOAD_STEADY,
    ROUTE_OVERLAP_LOW,
    SUSTAIN,
)
from moescope.traces import Trace


def check_route_overlap(trace: Trace) -> list[Finding]:
    points = series(trace, S.ROUTE_OVERLAP)
    start = throughout([v < ROUTE_OVERLAP_LOW for _, v in points])
    if start is None:
        return []
    step, value = points[start]
    return [
        Finding(
            "route_overlap_low",
            step,
            "warning",
            f"Routing replay is wired wrong from step {step}: only {value:.0%} of the replayed expert "
            f"choices are the trainer's own (below {ROUTE_OVERLAP_LOW:.0%}); routes from a stale step, "
            "shifted by a token or missing for some tokens.",
            {"key": S.ROUTE_OVERLAP, "value": value, "threshold": ROUTE_OVERLAP_LOW},
        )
    ]


def check_optimizer_reset(trace: Trace) -> list[Finding]:
    points = series(trace, S.OPTIMIZER_STEPS)
    ratio = dict(series(trace, S.UPDATE_RATIO))
    for (_, before), (step, after) in itertools.pairwise(points):
        if after < before:
            return [
                Finding(
                    "optimizer_reset",
                    step,
                    "warning",
                    f"The optimizer's state restarted at step {step} (its step count went from {before:g} "
                    f"back to {after:g}): a resume that restored the weights but not the optimizer state.",
                    {
                        "key": S.OPTIMIZER_STEPS,
                        "before": before,
                        "after": after,
                        "update_ratio": ratio.get(step),
                    },
                )
            ]
    return []


def check_aux_doubled(trace: Trace) -> list[Finding]:
    aux = series(trace, S.AUX_LOSS)
    cv = dict(series(trace, S.LOAD_CV))
    for i in range(1, len(aux)):
        (prev_step, prev), (step, value) = aux[i - 1], aux[i]
        if prev > 0 and abs(value / prev - AUX_DOUBLE) > AUX_DOUBLE_TOL * AUX_DOUBLE:
            continue  # not doubled here (most steps): the held values need not be looked at
        held = [v for _, v in aux[i : i + SUSTAIN]]
        if prev <= 0 or len(held) < min(SUSTAIN, len(aux) - i):
            continue
        doubled = all(abs(v / prev - AUX_DOUBLE) <= AUX_DOUBLE_TOL * AUX_DOUBLE for v in held)
        load = cv.get(step), cv.get(prev_step)
        steady = None in load or abs(load[0] - load[1]) <= LOAD_STEADY * abs(load[1])
        if doubled and steady:
            return [
                Finding(
                    "aux_loss_doubled",
                    step,
                    "warning",
                    f"The load-balancing loss doubles at step {step} ({prev:.3g} to {value:.3g}) while the "
                    "expert load does not move: it is counted twice (activation recompute, or the model's "
                    "own aux loss added to the trainer's).",
                    {"key": S.AUX_LOSS, "value": value, "before": prev},
                )
            ]
    return []
