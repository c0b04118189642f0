"""``grad_spike``, ``zero_grad`` and ``overflow``: what the gradient norm and the fp16 loss
scaler say about the updates."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.rules.frozen import significant_digits, unmoved_loss, zero_grad
from moescope.analyze.rules.losses import (
    LM_LOSSES,
    is_rl,
    level_losses,
    lm_losses,
    names_a_loss,
    own_losses,
)
from moescope.analyze.rules.series import (
    above_ceiling,
    column,
    episodes,
    finite_rows,
    first_logged,
    guarded,
    held_to_end,
    is_number,
    logged_key_set,
    logged_keys,
    row_medians,
    scaler_skipped,
    series,
    step_of,
    steps_of,
    window_blocks,
    windows,
)
from moescope.analyze.rules.thresholds import (
    FINE_DIGITS,
    GRAD_NORM_CEILING,
    GRAD_SPIKE_EXTREME,
    GRAD_SPIKE_FACTOR,
    GRAD_SPIKE_Z,
    LOW_SCALE,
    REPLAYED_RUN,
    SETTLED_SCALE,
    SUSTAIN,
    WINDOW,
    ZERO_LOSS,
    ZERO_LOSS_GRAD_MAX,
)
from moescope.analyze.rules.unchanged import unchanged_scores
from moescope.traces import Trace


def check_grad_spike(trace: Trace) -> list[Finding]:
    """A gradient norm far above its running median, or above ``GRAD_NORM_CEILING``; failing
    those, the spikes a trainer's own guard reports (:func:`_guarded_spikes`)."""
    key = first_logged(trace, (S.GRAD_NORM,))
    if key is None:
        return _guarded_spikes(trace)
    points = [(s, v) for s, v in series(trace, key) if v > 0]  # 0: a step without signal
    why = "an overflow or a non-finite value upstream"
    absurd = above_ceiling("grad_spike", key, points, GRAD_NORM_CEILING, "Gradient norm", why)
    spikes = [(points[i][0], points[i][1], math.exp(med)) for i, med in _spikes([v for _, v in points])]
    if absurd is not None and (not spikes or absurd.step < spikes[0][0]):
        return [absurd]
    if not spikes:
        return _window_spikes(trace) or _guarded_spikes(trace)
    step, value, base = spikes[0]
    return [
        Finding(
            "grad_spike",
            step,
            "warning",
            f"Gradient norm spikes to {value:.3g} at step {step}, {value / base:.0f}x the running median "
            f"{base:.3g}; {len(spikes)} spike(s) in all.",
            {"key": key, "value": value, "baseline": base, "steps": [s for s, _, _ in spikes]},
        )
    ]


def _window_spikes(trace: Trace) -> list[Finding]:
    """A gradient norm ``GRAD_SPIKE_FACTOR`` times the median of the optimizer's own recent steps:
    the largest of its window beside that median (icefall's ScaledAdam quartiles, ``… 3.570e-02
    4.058e-02 1.745e+00``), or a later step's norm against the last median it gave (its ``Scaling
    gradients by 0.026`` for a norm 38 times the threshold): the window is the history a paste of a
    few such lines does not show."""
    if S.GRAD_NORM_WINDOW_MAX not in logged_key_set(trace):
        return []
    median = None
    for i, rec in enumerate(trace.steps):
        norm, largest = rec.get(S.GRAD_NORM), rec.get(S.GRAD_NORM_WINDOW_MAX)
        if is_number(largest) and is_number(norm) and norm > 0:
            median, value = float(norm), float(largest)
        elif median is not None and is_number(norm):
            value = float(norm)
        else:
            continue
        if value >= GRAD_SPIKE_FACTOR * median:
            step = step_of(rec, i)
            message = (
                f"Gradient norm reaches {value:.3g} at step {step}, {value / median:.0f}x the median "
                f"{median:.3g} of the optimizer's own recent steps: a spike against the history it keeps (a "
                "learning rate too high, a bad batch, fp16 overflow upstream)."
            )
            return [
                Finding(
                    "grad_spike",
                    step,
                    "warning",
                    message,
                    {"key": S.GRAD_NORM, "value": value, "baseline": median},
                )
            ]
    return []


def _guarded_spikes(trace: Trace) -> list[Finding]:
    """The updates a trainer's own guard skipped for a gradient norm it judged a spike
    (``health/grad_spikes``): its threshold is the evidence where the log holds too few norms
    to judge a spike by (minFM's ``detected nan/inf/spiky gradient (norm=2.1967); skipping
    optimizer step``, four steps in a row, a batch too small for the guard's 2.0)."""
    steps, line = guarded(trace, S.GRAD_SPIKES)
    if not steps:
        return []
    low = line.lower()
    line = line[max(low.rfind("step", 0, max(low.find("spik"), 0)), 0) :]  # from its "Step N:", not its bar
    quoted = f" (the log says: {line!r})" if line else ""
    message = (
        f"The trainer's own guard judged the gradient norm a spike and skipped the update at step "
        f"{steps[0]}, {len(steps)} step(s) in all{quoted}: updates lost while the norm stays above "
        "the guard's threshold (a batch too small or too noisy for it, a learning rate too high)."
    )
    return [Finding("grad_spike", steps[0], "warning", message, {"key": S.GRAD_SPIKES, "steps": steps})]


def _spikes(norms: list[float]) -> list[tuple[int, float]]:
    """``(index, median log norm of the WINDOW before it)`` of every norm that spikes.

    A spike rises above the median of the previous ``WINDOW`` log norms by ``GRAD_SPIKE_FACTOR``
    and by ``GRAD_SPIKE_Z`` robust deviations of them (at least three of them); or stands ten times
    above every earlier one however spread they were (a history that stepped up once, 0.3 then
    1.2, widens the spread the robust test divides by), with little history (fewer than three)
    only when it is also ``GRAD_SPIKE_EXTREME`` times their median. The full windows' statistics
    are taken by numpy a block of windows at a time, not a window per step in Python, with the
    arithmetic :func:`statistics.median` does."""
    logs = np.asarray(list(map(math.log, norms)), dtype=np.float64)  # math.log: the same last bit
    n = len(logs)
    if n < 3:
        return []
    head = [logs[:i] for i in range(2, min(WINDOW, n))]  # growing windows, before WINDOW values
    med = [statistics.median(w.tolist()) for w in head]
    spread = [statistics.median(np.abs(w - m).tolist()) for w, m in zip(head, med, strict=True)]
    top = [float(w.max()) for w in head]
    full = windows(logs[:-1], WINDOW) if n > WINDOW else logs[:0, None]  # each index's from WINDOW on
    for block in window_blocks(full):
        centre = row_medians(block)
        med += centre.tolist()
        spread += row_medians(np.abs(block - centre[:, None])).tolist()
        top += block.max(axis=1).tolist()
    centre, spread_, top_ = np.array(med), np.array(spread), np.array(top)
    count = np.minimum(np.arange(2, n), WINDOW)
    rise = logs[2:] - centre
    robust = (
        (count >= 3)
        & (rise > math.log(GRAD_SPIKE_FACTOR))
        & (rise > GRAD_SPIKE_Z * np.maximum(spread_ * 1.4826, 0.05))
    )
    above_all = rise > top_ - centre + math.log(GRAD_SPIKE_FACTOR)
    extreme = above_all & ((count >= 3) | (rise > math.log(GRAD_SPIKE_EXTREME)))
    return [(int(i) + 2, med[i]) for i in np.flatnonzero(robust | extreme)]


def _reward_varies(rec: dict[str, Any]) -> bool | None:
    std = rec.get(S.REWARD_STD)
    if isinstance(std, int | float) and math.isfinite(std):
        return std > 0
    lo, hi = rec.get(S.REWARD_MIN), rec.get(S.REWARD_MAX)
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        return hi > lo
    return None


def check_zero_grad(trace: Trace) -> list[Finding]:
    """A gradient norm of exactly 0 that no reward statistic explains; failing that, one held to
    the end of the log under a non-zero loss, or a language-modelling loss held at 0 there (no
    token scored: the updates carry no signal, whatever norm is logged), or pinned at one value
    on every record, or scores that no update changes (:mod:`~moescope.analyze.rules.unchanged`),
    or a preference run's log-probabilities at exactly 0."""
    key = first_logged(trace, (S.GRAD_NORM,))
    found = [] if key is None else _unexplained_zero_norm(trace, key) or _zero_norm_under_loss(trace, key)
    found = found or _loss_at_zero(trace, key) or unmoved_loss(trace) or unchanged_scores(trace)
    return found or _preference_unscored(trace) or _preference_frozen(trace)


def _unexplained_zero_norm(trace: Trace, key: str) -> list[Finding]:
    zeros = [i for i, value in enumerate(column(trace, key)) if value == 0]  # few records, if any
    steps = steps_of(trace)
    hits = [(steps[i], trace.steps[i]) for i in zeros if _no_update(trace.steps[i], key)]
    if not hits:
        return []
    steps, blind = [s for s, _ in hits], _reward_varies(hits[0][1]) is None
    why = (
        "and so is the loss, with no reward statistics logged to tell whether every group's rewards "
        "were equal"
        if blind
        else "while rewards still vary"
    )
    message = (
        f"Gradient norm is exactly 0 at step {steps[0]} {why} ({len(steps)} such step(s)): the "
        "update saw no signal (a detached loss, a masked batch)."
    )
    return [zero_grad(steps, message, key=key, rewards_logged=not blind)]


def _no_update(rec: dict[str, Any], key: str) -> bool:
    """A zero gradient that no reward statistic explains: rewards vary, or none are logged and
    the loss is exactly 0 too (one pasted record of ``loss: 0.0, grad_norm: 0.0``)."""
    if rec.get(key) != 0 or rec.get(S.NO_SIGNAL_FRAC, 0.0) >= 1.0:
        return False
    varies = _reward_varies(rec)
    if varies is None:
        return S.NO_SIGNAL_FRAC not in rec and rec.get(S.ACTOR_LOSS) == 0
    return varies


def _zero_norm_under_loss(trace: Trace, key: str) -> list[Finding]:
    """A norm of exactly 0 on the records a log ends on (two at least) while their loss is not 0
    and no reward statistic is logged: equal rewards would zero the loss as well, so nothing but
    an update that never reaches the weights explains it (a LoRA or frozen-module mistake)."""
    steps = _ending_run(trace, key, lambda rec: _stuck_under_loss(rec, key), least=2)
    if not steps:
        return []
    message = (
        f"Gradient norm is exactly 0 from step {steps[0]} to the end of the log ({len(steps)} "
        "records) while the loss is not: no update reaches the weights (a loss detached from "
        "the graph, frozen or unregistered parameters)."
    )
    return [zero_grad(steps, message, key=key, rewards_logged=False)]


def _stuck_under_loss(rec: dict[str, Any], key: str) -> bool:
    loss = next((rec[k] for k in (S.ACTOR_LOSS, *LM_LOSSES) if is_number(rec.get(k))), None)
    return (
        rec[key] == 0
        and _reward_varies(rec) is None
        and S.NO_SIGNAL_FRAC not in rec
        and loss is not None
        and math.isfinite(loss)
        and loss != 0
    )


def _loss_at_zero(trace: Trace, norm: str | None) -> list[Finding]:
    """A language-modelling loss at exactly 0, as logged, on the two or more records the log ends
    on, or the one a short paste ends on (a record whose gradient norm is not finite belongs to the
    non-finite finding): one record of 0 may be a batch whose labels were all masked, two in a
    row are the run (TRL#618's 4-bit SFT, 0.0 after a jump to 31.45, epoch after epoch). A loss of
    another name (one head's of several) counts where an accuracy of 0 stands beside it: PaddleOCR's
    ``acc: 0.000000, CTCLoss: 0.000000`` while its SAR head's loss moves. A log that names no loss
    a key map knows and one of its own is judged on it, at 0 on ``REPLAYED_RUN`` records or more
    (SEC-MXNet's ``MultiLogisticLoss=0.000000`` batch after batch)."""
    scored = lm_losses(trace)
    known = first_logged(trace, level_losses(trace)) is not None
    own = [] if known else [k for k in own_losses(trace) if "scale" not in k.lower()]
    scored = tuple(own) if len(own) == 1 else scored
    heads = (
        () if is_rl(trace) else tuple(k for k in logged_keys(trace) if names_a_loss(k) and k not in scored)
    )
    norm = None if norm is not None and _norm_frozen(trace, norm) else norm
    for key in (*scored, *heads):
        flag = (
            partial(_zero_with_a_small_norm, loss=key, norm=norm)
            if key in scored
            else partial(_unscored, loss=key)
        )
        # a name of its own needs more records at 0, however short the paste
        length, least = (REPLAYED_RUN, REPLAYED_RUN) if key in own else (2, 1)
        steps = _ending_run(trace, key, flag, least=least, length=length)
        if steps:
            last = dict(series(trace, key))[steps[-1]]
            zero = "0" if last == 0 else f"{last:.3g}, 0 but for rounding,"
            message = (
                f"{key} is {zero} from step {steps[0]} to the end of the log ({len(steps)} record(s)) in "
                "a run that is not RL: a loss of 0 scores no token or box, so the updates carry no "
                "signal (every label masked or none found, a template that drops the response, an "
                "fp16 overflow reported as 0)."
            )
            return [zero_grad(steps, message, key=key, loss_zero=True)]
    return []


def _preference_unscored(trace: Trace) -> list[Finding]:
    """A preference run (DPO and kin) whose chosen and rejected log-probabilities are exactly 0 on
    the records it ends on: a log-probability summed or averaged over a response is below 0 as
    soon as one token is scored, so none is (every label masked, responses cut off by the length
    limits), and the loss sits at log 2 = 0.6931 with every reward and margin at 0."""
    chosen, rejected, steps = _pair_at_zero(trace, "logps")
    if not steps:
        return []
    message = (
        f"{chosen} and {rejected} are exactly 0 from step {steps[0]} to the end of the log ({len(steps)} "
        "record(s)): a log-probability over a response is below 0 once one token is scored, so no "
        "token is (every label masked, responses cut off by the length limits); the preference loss "
        "sits at log 2 and nothing is learned."
    )
    return [zero_grad(steps, message, key=chosen)]


def _preference_frozen(trace: Trace) -> list[Finding]:
    """A preference run whose chosen and rejected rewards are exactly 0 on the ``SUSTAIN`` or more
    records it ends on (its responses scored, or :func:`_preference_unscored` says so): a DPO reward
    is beta times the policy's log-probability less the reference's, so the policy is the
    reference to the last bit, step after step: no update reached it (a LoRA adapter that is also
    the reference, frozen or untrained weights; a DPO run whose loss holds at log 2 = 0.6931)."""
    chosen, rejected, steps = _pair_at_zero(trace, "rewards", least=SUSTAIN)
    if not steps:
        return []
    message = (
        f"{chosen} and {rejected} are exactly 0 from step {steps[0]} to the end of the log "
        f"({len(steps)} records): the policy's log-probabilities equal the reference's to the last "
        "bit, so no update has changed the policy and the preference loss sits at log 2."
    )
    return [zero_grad(steps, message, key=chosen)]


def _pair_at_zero(trace: Trace, family: str, least: int = 1) -> tuple[str, str, list[int]]:
    """A preference run's ``<family>/chosen`` and ``<family>/rejected`` and the steps of the run
    of records, ``least`` or more where the paste is short, on which both are exactly 0 to the
    end of the log (:func:`_ending_run`; none where either is not logged)."""
    chosen, rejected = f"{family}/chosen", f"{family}/rejected"
    if not {chosen, rejected} <= logged_key_set(trace):
        return chosen, rejected, []
    return (
        chosen,
        rejected,
        _ending_run(trace, chosen, lambda rec: rec[chosen] == 0 and rec.get(rejected) == 0, least),
    )


def _norm_frozen(trace: Trace, norm: str) -> bool:
    """A gradient norm that holds one value to its seventh digit or beyond on every record, three
    or more, whatever the loss, or to any digit while the loss beside it halves or more: no
    measure of a gradient (Qwen3-VL under ZeRO-2, ``grad_norm: 1.4142135381698608`` beside a loss
    of 1.502 and then 0.0; DiffusionVL's ``grad_norm: 2.0`` beside 16.24, then 0.0), so it says
    nothing of one."""
    values = [v for _, v in series(trace, norm)]
    if len(values) < SUSTAIN or len(values) != len(trace.steps) or len(set(values)) != 1 or values[0] == 0:
        return False
    loss = next((key for key in lm_losses(trace) if series(trace, key)), None)
    losses = [abs(v) for _, v in series(trace, loss)] if loss else []
    moved = bool(losses) and max(losses) > 0 and max(losses) >= 2 * min(losses)
    return significant_digits(values[0]) >= FINE_DIGITS or moved


def _zero_with_a_small_norm(rec: dict[str, Any], loss: str, norm: str | None) -> bool:
    """A loss of 0 (within ``ZERO_LOSS``: caffe's ``loss = -6.43825e-20`` is a sum's rounding)
    whose gradient norm, where logged, is finite and below ``ZERO_LOSS_GRAD_MAX``, or beside an
    accuracy of exactly 0: a loss of 0 scores every token right, an accuracy of 0 none, so no
    token is scored at all (ms-swift#8142: ``loss 0.0, token_acc 0.0`` beside a clipped norm of
    1.0 on every record; a GRPO loss, 0 by construction, logs no accuracy)."""
    value = rec.get(norm) if norm else None
    small = (norm not in rec) if value is None else is_number(value) and 0 <= value < ZERO_LOSS_GRAD_MAX
    unread = is_number(value) and not math.isfinite(value)  # the non-finite finding's record
    return abs(rec[loss]) <= ZERO_LOSS and (small or (_none_right(rec) and not unread))


def _unscored(rec: dict[str, Any], loss: str) -> bool:
    """A loss of 0 beside an accuracy of 0 on the record."""
    return abs(rec[loss]) <= ZERO_LOSS and _none_right(rec)


def _none_right(rec: dict[str, Any]) -> bool:
    """Whether the record logs an accuracy (not a reward's) of exactly 0."""
    return any(
        "acc" in key.lower() and "reward" not in key.lower() and is_number(value) and value == 0
        for key, value in rec.items()
    )


def _ending_run(
    trace: Trace, key: str, flag: Callable[[dict[str, Any]], bool], least: int = 1, length: int = SUSTAIN
) -> list[int]:
    """The steps of the flagged run a log ends on (:func:`held_to_end`), among the records that
    log ``key`` as a finite number; empty when there is none."""
    rows = finite_rows(trace, key)
    run = sum(1 for _ in itertools.takewhile(flag, map(trace.steps.__getitem__, reversed(rows))))
    start = held_to_end(run, len(rows), length, least)
    steps = steps_of(trace)
    return [] if start is None else [steps[i] for i in rows[start:]]


def check_overflow(trace: Trace) -> list[Finding]:
    """The largest episode of skipped fp16 steps, dated where the scale first fell below 1 if that
    is earlier. Overflows that open the run and leave the scale
    high are the scaler settling (a note); a scale driven below 1, or an overflow the scaler can
    no longer absorb because it is at its floor, is not; a scaler that says it stopped the run at
    its minimum (``Exiting run``), or one at its floor on every step logged from some step on
    (:func:`_pinned`), is an error whatever its scale."""
    scale = series(trace, S.LOSS_SCALE)
    floored = _floored_steps(trace)
    stopped = [s for s, v in series(trace, S.SCALER_STOPPED) if v > 0]
    unstepped = _every_step_skipped(trace)
    if scale and all(v == 1.0 for _, v in scale) and not floored and not stopped:
        return []  # no loss scaling: skipped steps were non-finite gradients (see nonfinite)
    skipped = {s: v for s, v in series(trace, S.SKIPPED) if v > 0} or (_scaler_skips(trace) if scale else {})
    if not skipped and unstepped:
        skipped = {unstepped[0]: float(unstepped[0])}  # the count says what no overflow line did
    if not skipped:
        return _scale_below_one(scale)
    runs = episodes(sorted(skipped))
    worst = max(runs, key=lambda run: (sum(skipped[s] for s in run), -run[0]))
    halvings = [b[0] for a, b in itertools.pairwise(scale) if b[1] < a[1]]
    lowest = min((v for _, v in scale), default=math.nan)
    settling = _settling(trace, worst, lowest, scale)
    pinned = _pinned(trace, floored)
    severity = (
        "error" if stopped or pinned or unstepped else _overflow_severity(worst, lowest, floored, settling)
    )
    total = sum(skipped.values())
    below = next((s for s, v in scale if v < 1), None)  # an error from there, before the largest episode
    onset = below if below is not None and below < worst[0] else worst[0]
    early = f", where the loss scale fell below 1; from step {worst[0]}" if onset != worst[0] else ""
    lost = int(sum(skipped[s] for s in worst))
    return [
        Finding(
            "overflow",
            onset,
            severity,
            f"fp16 overflow from step {onset}{early}: {lost} update(s) skipped on "
            f"{len(worst)} nearby step(s) ({int(total)} in the run), {_scale_path(halvings, lowest)}"
            f"{_overflow_reading(settling, floored, stopped, pinned, unstepped)}.",
            {
                "skipped_steps": sorted(skipped),
                "episodes": runs,
                "skipped": total,
                "halvings": halvings,
                "lowest_scale": lowest,
                "at_floor": floored,
                "stopped": stopped,
                "every_step_skipped": unstepped,
                "pinned": pinned,
            },
        )
    ]


def _scaler_skips(trace: Trace) -> dict[int, float]:
    """The steps a GradScaler skipped where the log names none (:func:`scaler_skipped`): a step each."""
    norms = column(trace, S.GRAD_NORM)
    rows = [i for i, v in enumerate(norms) if isinstance(v, float) and not math.isfinite(v)]
    return {step_of(trace.steps[i], i): 1.0 for i in rows if scaler_skipped(trace.steps[i])}


def _scale_below_one(scale: list[tuple[int, float]]) -> list[Finding]:
    """A loss scale below 1 in a log that names no skipped step. A dynamic scaler starts at 2^7 to
    2^32 and falls only on an overflow, so below 1 it has overflowed again and again with the
    gradients already scaled down; the log printed its summaries, not the overflow lines
    (fairseq's epoch record ``loss_scale 0.000`` before ``Minimum loss scale reached``)."""
    below = [s for s, v in scale if v < 1]
    if not below:
        return []
    lowest = min(v for _, v in scale)
    message = (
        f"fp16 overflow by step {below[0]}: the loss scale is {lowest:.3g}, below 1; a dynamic scaler "
        "falls only on an overflow, so the gradients overflowed fp16 even scaled down (the log names "
        "no skipped step itself)."
    )
    evidence = {"skipped_steps": [], "skipped": 0, "lowest_scale": lowest, "below_one": below}
    return [Finding("overflow", below[0], "error", message, evidence)]


def _scale_path(halvings: list[int], lowest: float) -> str:
    """How far the loss scale fell: its falls between records, or only its lowest where the
    log's overflow lines all went on one record (fairseq's fall to its minimum after the last)."""
    if halvings:
        return f"the loss scale fell {len(halvings)} time(s) (lowest {lowest:.3g})"
    return f"the loss scale at its lowest {lowest:.3g}" if math.isfinite(lowest) else "no loss scale logged"


def _overflow_reading(
    settling: bool, floored: list[int], stopped: list[int], pinned: bool, unstepped: list[int]
) -> str:
    """What the episode means, where the numbers alone do not say it."""
    if stopped:
        return f"; at step {stopped[0]} the scaler, at its minimum, stopped the run"
    if unstepped:
        return (
            f"; DeepSpeed counts every one of the {unstepped[0]} steps so far skipped "
            f"(step={unstepped[0]}, skipped={unstepped[0]}): no update has gone through"
        )
    if pinned:
        return (
            f"; from step {floored[0]} every step logged overflowed at the scale's floor, so no update "
            "has gone through since"
        )
    if floored:
        return f"; at step {floored[0]} the scale was already at its floor, so each overflow loses its update"
    return "; the scaler settling at the start of the run" if settling else ""


def _settling(trace: Trace, worst: list[int], lowest: float, scale: list[tuple[int, float]]) -> bool:
    """Overflows opening the run that leave the scale high: dynamic loss scaling finding its level
    down from its 2^16 or 2^32 start, as it does in every healthy fp16 run. Settling only lowers
    the scale: one that rises within the episode was raised (a scaler reset, or a scale set too
    high on purpose) and overflowed again, which is no settling; nor is a scale that does not move
    over more than ``SUSTAIN`` skipped steps (a fixed loss scale: Megatron-LM#602 skipped every
    iteration at 16384, the optimizer never stepped)."""
    first = min(steps_of(trace), default=worst[0])
    within = [v for s, v in scale if worst[0] <= s <= worst[-1]]
    falls_only = all(b <= a for a, b in itertools.pairwise(within))
    unmoved = len(within) > SUSTAIN and within[-1] == within[0]
    return worst[0] == first and lowest >= SETTLED_SCALE and falls_only and not unmoved


def _floored_steps(trace: Trace) -> list[int]:
    """Steps whose overflow tried the same low scale it fell back to: the scaler is at its
    minimum, so every further overflow is a lost update (DeepSpeed's ``reducing loss scale from 1
    to 1``). At a high scale (``Attempted loss scale: 4294967296, reducing to 4294967296``) the
    scaler's hysteresis held it for one more overflow: no floor."""
    tried = dict(series(trace, S.LOSS_SCALE_TRIED))
    return [s for s, v in series(trace, S.LOSS_SCALE) if tried.get(s) == v and v <= LOW_SCALE]


def _every_step_skipped(trace: Trace) -> list[int]:
    """The last step, where DeepSpeed's running count of skipped steps equals the step itself on
    it (``step=16, skipped=16``) after ``SUSTAIN`` steps or more: no update has gone through, as
    when the scaler stops the run (it does, one overflow later, at a scale of 1)."""
    totals = series(trace, S.SKIPPED_TOTAL)
    if not totals:
        return []
    step, total = totals[-1]
    return [step] if step >= SUSTAIN and total >= step else []


def _pinned(trace: Trace, floored: list[int]) -> bool:
    """Every step logged from the first at the scale's floor on is skipped at the floor, for
    :data:`SUSTAIN` steps or more: the scaler can fall no further and nothing trains any more
    (DeepSpeed's ``Attempted loss scale: 1, reducing to 1`` step after step). Fewer such steps
    may yet be followed by one that goes through: a warning."""
    if not floored:
        return False
    since = [s for s in steps_of(trace) if s >= floored[0]]
    return len(since) >= SUSTAIN and set(since) <= set(floored)


def _overflow_severity(worst: list[int], lowest: float, floored: list[int], settling: bool) -> str:
    """Error below a scale of 1; a warning for a sustained episode, one at the scaler's floor, or
    one that drove the scale to ``LOW_SCALE`` or below; a note for a short episode at a higher
    scale, or for the settling that opens a run."""
    if lowest < 1:
        return "error"
    if floored or lowest <= LOW_SCALE or (len(worst) > SUSTAIN and not settling):
        return "warning"
    return "info"
