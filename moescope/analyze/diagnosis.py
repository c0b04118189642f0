"""``diagnose(trace) -> findings``: what went wrong in a training run, and when.

What to try next for each finding — its likely causes, and the ``moescope validate`` lines that
test a fix on a proxy — is :mod:`moescope.analyze.remedies`.

Works on the canonical trace form (a moescope replay, or any log :mod:`moescope.analyze.readers`
reads), so absent metrics are simply not judged. Each check is one function over the step
records, one module per finding family under :mod:`moescope.analyze.rules`; thresholds are
constants of :mod:`moescope.analyze.rules.thresholds`, chosen so a healthy toy replay raises
nothing (negative controls in the tests):

- ``nonfinite``: the first step with a NaN/±Inf (or a ``null`` that stands for one) and the
  metric families that went first, in pipeline order — log-prob/KL, policy loss, critic,
  gradients; a loss field that vanishes from a step logging the same other metrics, in a log
  where it is present at least as often as missing (Megatron drops a NaN loss; two pasted lines
  can say it), is a *suspected* non-finite loss. Isolated (finite again on the next step) or
  persistent. A step whose gradients alone went non-finite while the loss stayed finite and the
  learning rate did not move is named a skipped update; a loss or gradient norm logged as null
  is decisive on one record.
- ``grad_spike``: a gradient norm ``GRAD_SPIKE_FACTOR`` times above the median of the previous
  ``WINDOW`` steps and more than ``GRAD_SPIKE_Z`` robust deviations (MAD of log norms) away; with
  fewer than 3 earlier steps that had a gradient, ``GRAD_SPIKE_EXTREME`` times the median and
  ``GRAD_SPIKE_FACTOR`` times the largest. Steps with a norm of 0 (no signal) are left out. A
  norm of ``GRAD_NORM_CEILING`` or more needs no history (a pasted excerpt's first line) and is
  an ``error``: no healthy run logs one.
- ``zero_grad``: a gradient norm of exactly 0 while rewards still vary, or, with no reward
  statistic logged, together with a loss of exactly 0, or under a non-zero loss on the records
  the log ends on (two at least); failing that, the LM loss of a run that is neither RL nor
  preference optimisation at exactly 0 on the records the log ends on (``SUSTAIN``, or the last
  record of a short paste), beside a gradient norm below ``ZERO_LOSS_GRAD_MAX`` where one is
  logged (a larger one is a loss that is 0 by construction).
- ``overflow``: the largest episode of fp16 steps skipped by the loss scaler; a short one, or
  the scaler settling at the run's start with the scale left at ``SETTLED_SCALE`` or above, is
  ``info``, a longer one or one at the scaler's floor (it tried the scale it fell back to) a
  ``warning``, a scale below 1, or a scaler that stopped the run at its minimum, an ``error``.
- ``loss_divergence``: only on losses that have a level (critic value loss, the LM loss of a run
  that is not RL), never on a GRPO policy loss, whose level is near 0 by construction: the
  running median rises ``DIVERGENCE_FACTOR`` times above the early-run baseline and stays there
  (an ``error``); or, within the first ``WINDOW`` values, the next ``SUSTAIN`` values all exceed
  ``DIVERGENCE_FACTOR`` times everything before them (a ``warning``: a short healthy head; an
  ``error`` where the loss then holds one value exactly to the end, a saturated net); or
  the last record is ``DIVERGENCE_FACTOR``² times the median of the ``SUSTAIN`` or more before
  it (a ``warning``: a paste stopped where the loss exploded).
- ``kl_blowup``: KL to the reference jumps above ``KL_BLOWUP_MIN`` nats and ten times its running
  median, or reaches ``KL_CEILING`` nats per token on any record (a snapshot has no median).
- ``entropy_collapse`` / ``entropy_surge``: the running mean of token entropy falls below half
  the early-run baseline (and under the OPEFO floor, when the run had one) / rises above three
  times it, for ``SUSTAIN`` steps.
- ``reward_collapse``: the running mean reward falls below a fifth of a positive early baseline, or
  of the peak it reached after.
- These running means span ``SUSTAIN`` steps, or more where the series' own step-to-step noise
  (at the extremes a series of its length reaches by chance) is of the size of the shift: a reward
  drawn afresh each step from a batch of one dips by chance somewhere in a long run.
- ``no_signal``: every group's rewards were equal (no GRPO gradient: ``frac_reward_zero_std`` at 1,
  or every advantage exactly 0, or a reward std of exactly 0) on most steps, dated where
  such steps first follow one another for ``SUSTAIN`` steps; or on the log's last ``SUSTAIN`` or
  more steps (``frac_reward_zero_std`` gone to 1: a run that stalls late), dated where that began.
  A ``warning``; an ``error`` where those steps are decisive on their own: every response scored
  exactly 0 on each (the reward never paid), or the gradient norm was exactly 0 on each.
- ``degenerate_output``: all responses truncated, or a constant response length, for ``SUSTAIN``
  steps.

Those two, and the load-balancing level below, are also decisive in an excerpt shorter than
``SUSTAIN`` records when every record says it (``series.throughout``): one TRL line with
``frac_reward_zero_std: 1.0`` is no signal, one with ``completions/clipped_ratio: 1.0`` is
degenerate output.
- ``load_collapse`` (per layer): over a window of steps, one expert takes more than
  ``LOAD_SHARE_FACTOR`` times its uniform share and twice its early-run share, or a quarter of
  the experts that were busy early on receive nothing; or a load-balancing loss twice its early
  value, or (Megatron's, logged unscaled: 1 when balanced; also per layer) at ``LBL_IMBALANCED``
  or more; or,
  for a log with only the scalars, a load CV above 1 and twice its early value (per layer too),
  a quarter of the experts dead, or MaxVio at ``LOAD_SHARE_FACTOR`` − 1; on an excerpt too short
  for a trend (a user's printed top-k ids), one expert with half the slots on every record. A
  log that turns activation recompute on has its Megatron load-balancing loss halved (recorded
  twice, Megatron-LM#1330).
- ``rollout_mismatch``: the rollout engine's log-probs drift from the trainer's, by the level,
  the rise or the onset of any mismatch metric, the importance weights' effective sample size
  held low, or a token-level clip fraction held high (not judged where ratios are
  sequence-level, as in GSPO) (:mod:`moescope.analyze.rules.mismatch`).
- ``route_overlap_low``, ``optimizer_reset``, ``aux_loss_doubled``: routing replay fed other
  routes than the trainer's router makes, an optimizer state that restarted mid-run, a
  load-balancing loss counted twice (:mod:`moescope.analyze.rules.wiring`).
"""

from __future__ import annotations

from collections.abc import Callable

from moescope.analyze.findings import FINDING_TYPES, Finding
from moescope.analyze.rules.gradients import check_grad_spike, check_overflow, check_zero_grad
from moescope.analyze.rules.load import check_load_collapse
from moescope.analyze.rules.losses import check_kl_blowup, check_loss_divergence
from moescope.analyze.rules.mismatch import check_rollout_mismatch
from moescope.analyze.rules.nonfinite import check_nonfinite
from moescope.analyze.rules.policy import (
    check_degenerate_output,
    check_entropy,
    check_no_signal,
    check_reward_collapse,
)
from moescope.analyze.rules.series import reading_once
from moescope.analyze.rules.wiring import check_aux_doubled, check_optimizer_reset, check_route_overlap
from moescope.traces import Trace

CHECKS: tuple[Callable[[Trace], list[Finding]], ...] = (
    check_nonfinite,
    check_grad_spike,
    check_zero_grad,
    check_overflow,
    check_loss_divergence,
    check_kl_blowup,
    check_entropy,
    check_reward_collapse,
    check_no_signal,
    check_degenerate_output,
    check_load_collapse,
    check_rollout_mismatch,
    check_route_overlap,
    check_optimizer_reset,
    check_aux_doubled,
)


def diagnose(trace: Trace) -> list[Finding]:
    """All findings of ``trace``, ordered by onset step (findings without a step last); on one
    step, in the order of :data:`~moescope.analyze.findings.FINDING_TYPES`, causes before their
    effects (a NaN before the clipped responses and dead rewards that step also logs)."""
    findings: list[Finding] = []
    with reading_once():  # the checks share the columns they read
        for check in CHECKS:
            findings += check(trace)
    return sorted(findings, key=_onset_order)


def _onset_order(finding: Finding) -> tuple[bool, int, int]:
    step = finding.step
    return step is None, step if step is not None else 0, FINDING_TYPES.index(finding.type)
