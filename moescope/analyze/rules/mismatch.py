"""``rollout_mismatch``: the rollout engine's log-probs drift from the trainer's.

The most discussed MoE failure of RL (routing flips near ties, kernels, precision): the two
sides score the same tokens differently, and a growing gap precedes collapse. Read from any
mismatch metric a log carries (the key map gives each framework's under these names):

- ``rollout/k3_kl``, the k3 estimate of KL(rollout ‖ training) (verl ``rollout_corr/k3_kl``,
  ms-swift ``k3_kl``, prime-rl ``Mismatch KL``, NeMo-RL ``gen_kl_error``): a level of
  ``MISMATCH_K3_HIGH`` or more held for ``SUSTAIN`` records is a warning, ten times that on any
  one record an error (a single batch of hard tokens spikes it; a level it keeps is a fault).
  Practitioners see about 1e-5–1e-3 on dense models and 1e-3–1e-1 on MoE (``rl-mismatch``
  reference: verl's rollout correction, NeMo-RL#1801, vime#64);
- ``rollout/logprob_mismatch``, the mean |Δ log-prob| (TRL ``sampling_logp_difference/mean``,
  slime ``train_rollout_logprob_abs_diff``): judged by its trend (vime#64: flat at 0.011 with a
  sound engine, climbing to 0.036 with a faulty one), and by a level of ``MISMATCH_LOGPROB_HIGH``
  held (a pasted excerpt with no trend to show);
- ``rollout/mult_prob_error``, NeMo-RL's ``token_mult_prob_error``, the mean exp|Δ log-prob| (1
  when equal): above ``MISMATCH_MULT_PROB_HIGH``, the bound a NeMo-RL recipe asserts;
- ``rollout/probs_diff_mean``, verl's ``training/rollout_probs_diff_mean`` (of probabilities):
  judged by its trend;
- ``rollout/is_ess``, the effective sample size of the importance weights (π_train / π_rollout)
  as a fraction of the batch (verl ``rollout_corr/rollout_is_eff_sample_size``): 1 when the two
  sides agree, and it falls as a few samples' weights grow to carry the batch. At or below
  ``IS_ESS_LOW`` (verl's own warning level) held for ``SUSTAIN`` records is a warning, at or
  below ``IS_ESS_SEVERE`` on any one record an error. It is judged by its level only: it falls
  from 1, so a rise or an onset says nothing.

Besides a level, two shapes count, because "a rising trend matters more than a level": a
**rise**, the running median ``MISMATCH_RISE`` times its early-run level or more for ``SUSTAIN``
steps (for the k3 KL also above ``MISMATCH_K3_FLOOR``, the top of the dense band); and an
**onset**, a metric absent or exactly 0 on the first ``SUSTAIN`` records that is then positive on
``SUSTAIN`` records in a row: the two sides stopped agreeing bit for bit. A moescope replay whose
rollout runs in the training precision (its header says so) should agree bit for bit throughout,
so there any positive mismatch held for ``SUSTAIN`` records counts, from the step it starts: a
``rollout_logprob_precision`` or ``router_precision`` fault raises it at the step it begins, from
step 0 on. A replay configured with a lower-precision rollout is judged like a real log.

A mismatch also shows in the policy loss: the ratio of the trainer's probability to the
sampler's leaves the trust region, so **the clip fraction** (``actor/clipfrac``) at
``CLIPFRAC_HIGH`` or more held for ``SUSTAIN`` records (every record of a shorter excerpt) is a
warning too — where the ratios are token-level. GSPO's sequence-level ratio clips about a
hundred times more tokens by design, so a run that is sequence-level (a replay with
``--algo gspo``, or a log whose config says so: the header's ``ratio_level``, set by
:mod:`moescope.analyze.readers.hints`) is not judged by its clip fraction. One finding per
trace, the earliest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.readers.hints import RATIO_LEVEL
from moescope.analyze.rules.series import (
    column,
    first_logged,
    logged_key_set,
    series,
    shift,
    step_of,
    sustained,
    throughout,
)
from moescope.analyze.rules.thresholds import (
    CLIPFRAC_HIGH,
    IS_ESS_LOW,
    IS_ESS_SEVERE,
    MISMATCH_K3_FLOOR,
    MISMATCH_K3_HIGH,
    MISMATCH_LOGPROB_HIGH,
    MISMATCH_MULT_PROB_HIGH,
    MISMATCH_RISE,
    SUSTAIN,
)
from moescope.traces import Trace


@dataclass(frozen=True)
class Gauge:
    """How one mismatch metric is judged: its level (``None``: trend only), the part of it
    that rises (``excess`` over its equal value) and the least a rise must reach."""

    keys: tuple[str, ...]
    high: float | None = None
    excess: Callable[[float], float] = lambda v: v
    floor: float = 0.0
    low: float | None = None  # judged at or below this level instead (a fraction that falls)
    severe: float | None = None  # ...and on one record at or below this one


GAUGES = (
    Gauge((S.MISMATCH_KL,), high=MISMATCH_K3_HIGH, floor=MISMATCH_K3_FLOOR),
    Gauge((S.LOGPROB_MISMATCH,), high=MISMATCH_LOGPROB_HIGH),
    Gauge((S.MULT_PROB_ERROR,), high=MISMATCH_MULT_PROB_HIGH, excess=lambda v: v - 1.0),
    Gauge((S.PROBS_DIFF_MEAN,)),
)


CLIPPING = Gauge((S.CLIPFRAC,), high=CLIPFRAC_HIGH)
SAMPLE_SIZE = Gauge((S.IS_ESS,), low=IS_ESS_LOW, severe=IS_ESS_SEVERE)


def check_rollout_mismatch(trace: Trace) -> list[Finding]:
    found = [f for gauge in GAUGES for f in _judge(trace, gauge)] + _clipping(trace) + _sample_size(trace)
    return [min(found, key=lambda f: (f.step, f.severity != "error"))] if found else []


def _judge(trace: Trace, gauge: Gauge) -> list[Finding]:
    key = first_logged(trace, gauge.keys)
    if key is None:
        return []
    points = series(trace, key)
    out = []
    if gauge.high is not None:
        out += _level(key, points, gauge)
    excess = [(s, gauge.excess(v)) for s, v in points]
    rise = shift(
        excess,
        lambda v, base: v >= MISMATCH_RISE * base and v >= gauge.floor,
        stat=statistics.median,
        positive_base=True,
    )
    if rise is not None:
        out.append(
            _finding(
                key,
                rise.step,
                "warning",
                f"{key} rises to {MISMATCH_RISE:g}x its early level {rise.base:.3g} or more",
                baseline=rise.base,
                rule="rise",
            )
        )
    if _engines_agree(trace):
        start = _unexpected(points)
        what = f"{key} is positive where the replay's rollout and training share one precision"
    else:
        start = _onset(trace, key)
        what = f"{key} turns positive after {SUSTAIN}+ records where the two sides agreed bit for bit"
    if start is not None:
        held = [v for s, v in points if s >= start]
        level = {"mean": statistics.fmean(held), "median": statistics.median(held)}
        out.append(_finding(key, start, "warning", what, rule="onset", **level))
    return out


def _clipping(trace: Trace) -> list[Finding]:
    """A token-level clip fraction held at its level (never an error: clipping bounds the update)."""
    if sequence_level(trace) or S.CLIPFRAC not in logged_key_set(trace):
        return []
    why = " of tokens, outside the clip range around the sampler's probabilities, as large updates also cause"
    found = _level(S.CLIPFRAC, series(trace, S.CLIPFRAC), CLIPPING, why)
    return [replace(f, severity="warning") for f in found]


def _sample_size(trace: Trace) -> list[Finding]:
    """The importance weights' effective sample size held low: a few samples carry the update."""
    if S.IS_ESS not in logged_key_set(trace):
        return []
    why = " of the batch: a few samples' importance weights carry the update"
    return _level(S.IS_ESS, series(trace, S.IS_ESS), SAMPLE_SIZE, why)


def sequence_level(trace: Trace) -> bool:
    """Whether the run's PPO ratios are sequence-level (GSPO): by its replay config or its log."""
    config = trace.header.get("replay_config")
    algo = config.get("algo") if isinstance(config, dict) else None
    return algo == "gspo" or trace.header.get(RATIO_LEVEL) == "sequence"


def _level(key: str, points: list[tuple[int, float]], gauge: Gauge, unit: str = "") -> list[Finding]:
    """At or above the gauge's level on ``SUSTAIN`` records in a row (or on every record of a
    shorter excerpt): a warning; ten times as far above the equal value on any one record: an
    error. One batch of hard tokens spikes a mismatch; a level it keeps is a fault."""
    if gauge.low is not None:  # a fraction that falls: its own severe level
        low, severe = gauge.low, gauge.severe
        spiked, holds = (lambda v: severe is not None and v <= severe), (lambda v: v <= low)
        said = ("falls to", f", at or below {severe:g}", f" and stays at or below {low:g}")
    else:
        high, severe = gauge.high, 10 * gauge.excess(gauge.high)
        spiked, holds = (lambda v: gauge.excess(v) >= severe), (lambda v: v >= high)
        said = ("reaches", f", ten times its {high:g} bound or more", f" and stays at or above {high:g}")
    spike = next(((s, v) for s, v in points if spiked(v)), None)
    start = throughout([holds(v) for _, v in points])
    held = points[start] if start is not None else None
    first = min((p for p in (spike, held) if p is not None), default=None)
    if first is None:
        return []
    error = first is spike
    what = f"{key} {said[0]} {first[1]:.3g}" + (said[1] if error else said[2]) + unit
    return [_finding(key, first[0], "error" if error else "warning", what, value=first[1], rule="level")]


def _engines_agree(trace: Trace) -> bool:
    """A moescope replay whose rollout runs in the training precision: its two sides compute the
    same log-probs bit for bit, so any mismatch is a fault's (a real log never says so)."""
    config = trace.header.get("replay_config")
    return isinstance(config, dict) and config.get("rollout_precision") in (None, config.get("precision"))


def _unexpected(points: list[tuple[int, float]]) -> int | None:
    """Where a mismatch that should be 0 is positive on ``SUSTAIN`` records in a row."""
    start = throughout([v > 0 for _, v in points])
    return None if start is None else points[start][0]


def _onset(trace: Trace, key: str) -> int | None:
    """The step a metric absent or 0 on the first ``SUSTAIN`` records turns positive for good."""
    values = column(trace, key)
    positive = [isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in values]
    if len(positive) < 2 * SUSTAIN or any(positive[:SUSTAIN]):
        return None
    start = sustained(positive)
    return None if start is None else step_of(trace.steps[start], start)


def _finding(key: str, step: int, severity: str, what: str, **evidence: object) -> Finding:
    return Finding(
        "rollout_mismatch",
        step,
        severity,
        f"Rollout and training log-probs drift apart from step {step}: {what} (routing flips, "
        "kernels or precision differ between the engines; see routing replay, importance-sampling "
        "correction, an fp32 router).",
        {"key": key, **evidence},
    )
