"""``loss_divergence`` and ``kl_blowup``: losses with a level that run away, and the policy
leaving its reference in one step."""

from __future__ import annotations

import itertools
import math
import re
import statistics
from dataclasses import replace

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.rules.series import (
    above_ceiling,
    accuracies,
    column,
    first_logged,
    guarded,
    is_number,
    logged_key_set,
    logged_keys,
    run_from_end,
    series,
    shared,
    shift,
    step_of,
)
from moescope.analyze.rules.thresholds import (
    CLIMB_OVER_RANGE,
    DIVERGENCE_FACTOR,
    KL_BLOWUP_MIN,
    KL_CEILING,
    LOSS_CEILING,
    PAIRED_CLIMB,
    PERPLEXITY_CEILING,
    RUNAWAY,
    STEADY_CLIMB,
    SUSTAIN,
    WINDOW,
    WORSE_ACCURACY,
    WORSE_LOSS,
)
from moescope.traces import Trace

LM_LOSSES = (S.LM_LOSS, S.LM_LOSS_SPACED, S.SFT_LOSS)
LEVEL_LOSSES = (S.VF_LOSS, S.CRITIC_LOSS, *LM_LOSSES)
RL_SIGNS = (S.REWARD_MEAN, S.PG_LOSS, S.KL, S.NO_SIGNAL_FRAC)
KL_KEYS = (S.KL, S.KL_LOSS)
PREFERENCE_PREFIXES = ("rewards/", "logps/")  # TRL's DPO / KTO / ORPO metrics: rewards/margins, …


def is_rl(trace: Trace) -> bool:
    """Whether a record logs a reward, a policy-gradient loss, a KL or the no-signal share as a
    number: LLaMA-Factory's SFT ``trainer_log.jsonl`` writes ``"reward": null`` on every line."""
    logged = logged_key_set(trace)
    return any(any(map(is_number, column(trace, key))) for key in RL_SIGNS if key in logged)


# a GAN's network named in a loss's key ("G loss", "loss_D", "Gen_loss"): its losses swing by design
_NETWORK = re.compile(r"(?:^|[\W_])(d|g|dis|disc|gen|generator|discriminator)(?:[\W_]|$)", re.I)


def network_of(key: str) -> str | None:
    """The GAN network a loss's key names: ``"d"`` (the discriminator) or ``"g"`` (the generator)."""
    named = _NETWORK.search(key)
    return named[1][0].lower() if named else None


def own_losses(trace: Trace) -> tuple[str, ...]:
    """A log's training losses under its own names, where it logs none a key map knows (MoBE's
    ``Scaled Loss``, I-JEPA's ``epoch avg loss``): judged for a divergence as a level loss is; not
    a held-out split's, not a GAN network's, not in RL."""
    if is_rl(trace):
        return ()
    return tuple(
        key
        for key in logged_keys(trace)
        if names_a_loss(key) and not HELD_OUT_KEY.match(key.lower()) and not _NETWORK.search(key)
    )


def network_losses(trace: Trace) -> tuple[str, ...]:
    """A GAN's losses, each named for its network (``D_data_loss``, ``G_total_loss``, ``loss_D``)."""
    return tuple(key for key in logged_keys(trace) if names_a_loss(key) and network_of(key))


def level_losses(trace: Trace) -> tuple[str, ...]:
    """Losses whose level means something: critic and LM losses; ``actor/loss`` only when the run
    is not RL (a Megatron pre-training or SFT log maps its ``lm loss`` there) or is value-based
    RL, whose one loss is a temporal-difference loss (keras-rl's DQN and DDPG log ``loss`` beside
    their ``mean_q``)."""
    value_based = not logged_key_set(trace).isdisjoint(Q_VALUES)
    return LEVEL_LOSSES if is_rl(trace) and not value_based else (*LEVEL_LOSSES, S.ACTOR_LOSS)


Q_VALUES = ("mean_q",)  # the mean Q-value keras-rl logs beside its critic's loss


def lm_losses(trace: Trace) -> tuple[str, ...]:
    """The language-modelling losses, which score tokens: ``actor/loss`` among them only when the
    run is neither RL (a GRPO policy loss is 0 by construction while every advantage is) nor
    preference optimisation (a DPO loss near 0 is its pairs' margins saturating)."""
    preference = any(key.startswith(PREFERENCE_PREFIXES) for key in logged_keys(trace))
    return LM_LOSSES if preference or is_rl(trace) else (*LM_LOSSES, S.ACTOR_LOSS)


def check_loss_divergence(trace: Trace) -> list[Finding]:
    """A level loss whose running median rises far above its early-run level; failing that, one
    that jumps far above everything before it and stays there (a paste whose healthy head is a
    line or two, too short for an early-run level). A loss at or above ``LOSS_CEILING`` on any
    record is an error on its own (a snapshot of one record has no level to rise from); after a
    jump, it makes that jump an error where it began. A log with no loss a key map knows is judged
    on its own loss names (:func:`own_losses`), the first that shows a divergence."""
    out = []
    scores_tokens = lm_losses(trace)
    levels = level_losses(trace)
    own = first_logged(trace, levels) is None  # no loss a key map knows: its own names
    for key in own_losses(trace) if own else levels:
        points = series(trace, key)
        absurd = above_ceiling("loss_divergence", key, points, LOSS_CEILING, key, "the weights diverged")
        left = _level_left(key, points) or (_climb_to_end(trace, key, points) if key in scores_tokens else [])
        if absurd is None:
            out += left
        elif left and left[0].step < absurd.step:
            value = absurd.evidence["value"]
            beyond = f" It reaches {value:.3g} at step {absurd.step}, above {LOSS_CEILING:.3g}: it diverged."
            out.append(replace(left[0], severity="error", message=left[0].message + beyond))
        else:
            out.append(absurd)
    if own:
        out = _one_of_own(trace, out)
    found = out or _any_loss_absurd(trace) or _perplexity_overflowed(trace) or _perplexity_risen(trace)
    found = found or _worse_at_its_data(trace) or _held_out_jump(trace)
    found = found or _far_above_its_best(trace) or _guard_stopped(trace)
    return found or _values_run_away(trace) or _jump_to_clamp(trace) or _jump_with_held_out(trace)


def _one_of_own(trace: Trace, found: list[Finding]) -> list[Finding]:
    """One finding of the divergence a log's own loss names show, an error first, then the earliest;
    none where a value went non-finite at its step or before (``nonfinite``'s, which dates it)."""
    if not found:
        return []
    first_bad = next((step_of(rec, i) for i, rec in enumerate(trace.steps) if _holds_nonfinite(rec)), None)
    kept = [f for f in found if first_bad is None or f.step < first_bad]
    return [min(kept, key=lambda f: (f.severity != "error", f.step))] if kept else []


def _holds_nonfinite(record: dict) -> bool:
    return any(isinstance(v, float) and not math.isfinite(v) for v in record.values())


def _values_run_away(trace: Trace) -> list[Finding]:
    """A critic's loss that climbs on every record to the end of the log, ``SUSTAIN`` rises or more,
    to ``RUNAWAY`` times its lowest, while every reward logged beside it on two of those records or
    more holds within a factor of two: a temporal-difference loss grows with the values it learns,
    and these values grow from no reward, so they feed on their own targets (SAC on Humanoid,
    MBPO's ``CLOSS`` 2.33 to 2.6e7 while its batch reward stays at 4.79: the Q-values ran away)."""
    rewards = [key for key in logged_keys(trace) if "reward" in key.lower()]
    critics = [k for k in logged_keys(trace) if names_a_loss(k) and ("critic" in k.lower() or k == S.VF_LOSS)]
    for key in critics if rewards else []:
        points = series(trace, key)
        values = [v for _, v in points]
        start = _climb_start(values)
        while start < len(values) - 1 and values[start] <= 0:  # the climb from its first positive value
            start += 1
        if len(values) - 1 - start < SUSTAIN or values[start] <= 0 or values[-1] < RUNAWAY * values[start]:
            continue
        trough, last = values[start], values[-1]
        steps = {s for s, _ in points[start:]}
        beside = [
            values for r in rewards if len(values := [v for s, v in series(trace, r) if s in steps]) > 1
        ]
        if beside and all(map(_holds_within_twice, beside)):
            message = (
                f"{key} climbs on every record from step {points[start + 1][0]}, {trough:.3g} to {last:.3g} "
                f"({last / trough:.3g}x), while the reward beside it holds: the values it learns grow from "
                "no reward, on their own targets (lower the learning rate, a slower target update, clipped "
                "or smaller rewards)."
            )
            return _diverged(points[start + 1][0], message, key, trough)
    return []


def _holds_within_twice(values: list[float]) -> bool:
    """Values of one sign, the largest in size at most twice the smallest."""
    sizes = [abs(v) for v in values]
    one_sign = all(v > 0 for v in values) or all(v < 0 for v in values)
    return one_sign and max(sizes) <= 2 * min(sizes)


def _guard_stopped(trace: Trace) -> list[Finding]:
    """The trainer's own divergence guard stopped the run (``health/diverged``): it compares the
    loss with its first and quits far above it (karpathy's neuraltalk, ``loss cost = 140.73``
    after 37.4 and 39.4, then ``Aboring, cost seems to be exploding``), which a paste of a few
    records cannot show by itself."""
    steps, said = guarded(trace, S.DIVERGED)
    if not steps:
        return []
    quoted = f" (the log says: {said!r})" if said else ""
    message = (
        f"The trainer's own guard judged the loss to be exploding and stopped the run at step "
        f"{steps[0]}{quoted}: the loss left the level it had learned (a learning rate too high, no "
        "gradient clipping)."
    )
    return [Finding("loss_divergence", steps[0], "error", message, {"key": S.DIVERGED, "steps": steps})]


def _far_above_its_best(trace: Trace) -> list[Finding]:
    """A training loss ``DIVERGENCE_FACTOR``² times or more above the best loss the same record
    says the run has reached (MeshMAE's ``Epoch 2 Pretrain | Loss: 39307117.63 | Best Loss:
    2.271230``): one record shows the run left the level it had, where no earlier record is
    pasted. A batch's loss strays a few times from a best, not twenty-five."""
    bests = [k for k in logged_keys(trace) if _BEST_LOSS.search(k)]
    for best in bests:
        floor = dict(series(trace, best))
        for key in level_losses(trace):
            above = [
                (s, v) for s, v in series(trace, key) if floor.get(s, 0) > 0 and v >= _BEST_FACTOR * floor[s]
            ]
            if above:
                step, value = above[0]
                message = (
                    f"{key} is {value:.4g} at step {step}, {value / floor[step]:.3g}x the best loss "
                    f"the run reached ({best} {floor[step]:.4g}): the run left the level it had; the "
                    "weights diverged."
                )
                return _diverged(step, message, key, floor[step])
    return []


def _diverged(step: int, message: str, key: str, baseline: float, severity: str = "warning") -> list[Finding]:
    """The one ``loss_divergence`` finding a rule gives: on ``step``, the level it left as evidence."""
    return [Finding("loss_divergence", step, severity, message, {"key": key, "baseline": baseline})]


_BEST_FACTOR = DIVERGENCE_FACTOR**2
_BEST_LOSS = re.compile(r"best[\s_]*loss$", re.IGNORECASE)  # "Best Loss", fairseq's "best_loss"


def _worse_at_its_data(trace: Trace) -> list[Finding]:
    """A language-modelling loss whose median over the last third of the records it shares with an
    accuracy (``SUSTAIN`` or more records a third) is ``WORSE_LOSS`` times its median over the
    first third, while the accuracy's falls to ``WORSE_ACCURACY`` of its own: the model gets
    worse at the data it trains on, two measures agreeing where a rise alone may be a harder
    stretch of data (ms-swift#3617: 2.81 -> 5.29 while token_acc 0.46 -> 0.22). Dated where the
    loss rises above the first third's highest for good."""
    loss = next((key for key in lm_losses(trace) if series(trace, key)), None)
    for key in accuracies(trace) if loss else ():
        if HELD_OUT_KEY.match(key.lower()):
            continue
        right = dict(series(trace, key))
        both = [(step, value, right[step]) for step, value in series(trace, loss) if step in right]
        third = len(both) // 3
        if third < SUSTAIN:
            found = _worse_since_its_best(loss, key, both)
            if found:
                return found
            continue
        before = statistics.median(v for _, v, _ in both[:third])
        after = statistics.median(v for _, v, _ in both[-third:])
        right_before = statistics.median(a for _, _, a in both[:third])
        right_after = statistics.median(a for _, _, a in both[-third:])
        if not (
            before > 0 and after >= WORSE_LOSS * before and 0 < right_after <= WORSE_ACCURACY * right_before
        ):
            continue
        highest = max(v for _, v, _ in both[:third])  # the run above the first third, to the end
        start = run_from_end(both, lambda row, highest=highest: row[1] > highest, floor=third)
        step = both[min(start, len(both) - 1)][0]
        message = (
            f"{loss} rises from a median of {before:.3g} to {after:.3g} ({after / before:.1f}x) while {key} "
            f"falls from {right_before:.3g} to {right_after:.3g}: the model gets worse at the data it trains "
            f"on, from step {step} (a learning rate too high for the run, a data stream that changed)."
        )
        return _diverged(step, message, loss, before)
    return []


def _worse_since_its_best(loss: str, key: str, both: list[tuple[int, float, float]]) -> list[Finding]:
    """:func:`_worse_at_its_data` in a paste too short for thirds: the loss at its last record at
    least twice its lowest before while the accuracy beside it falls to half of its own there or
    less (fastai#1736: a Transformer-XL's ``2.760716 … 0.442434`` then ``6.228361 … 0.076458``,
    epoch to epoch; keras#7603: ``0.8906 - acc: 0.6864`` at epoch 16, ``1.8483 - acc: 0.3402`` at
    800). Dated at the first record after the lowest that is so."""
    if len(both) < 2:
        return []
    best = min(range(len(both) - 1), key=lambda i: both[i][1])
    _, before, right_before = both[best]

    def worse(row: tuple[int, float, float]) -> bool:
        return before > 0 and row[1] >= 2 * before and 0 <= row[2] <= right_before / 2 and right_before > 0

    if not worse(both[-1]):
        return []
    step, after, right_after = next(row for row in both[best + 1 :] if worse(row))
    message = (
        f"{loss} rises from {before:.3g} to {after:.3g} ({after / before:.1f}x) by step {step} while {key} "
        f"falls from {right_before:.3g} to {right_after:.3g}: the model lost what it had learned (a learning "
        "rate too high for the run, a data stream that changed)."
    )
    return _diverged(step, message, loss, before)


def _perplexity_risen(trace: Trace) -> list[Finding]:
    """A perplexity, on training or held-out data, held ``DIVERGENCE_FACTOR`` times above its
    lowest on the two records or more a log ends on (a warning): the exponential of a
    cross-entropy risen by ln 5 = 1.6 nats a token, which no learning run gives back once it has
    it (attention-is-all-you-need-pytorch#60: validation 86 → 865 → 950 after a bad commit)."""
    for key in _perplexities(trace):
        points = [(s, v) for s, v in series(trace, key) if math.isfinite(v)]
        values = [v for _, v in points]
        lowest = min(values, default=0.0)
        start = run_from_end(values, lambda v, lowest=lowest: v >= DIVERGENCE_FACTOR * lowest)
        if lowest <= 0 or start == 0 or len(values) - start < 2:
            continue
        step, last = points[start][0], values[-1]
        message = (
            f"{key} rises from its lowest {lowest:.4g} to {values[start]:.4g} at step {step} and stays "
            f"{DIVERGENCE_FACTOR:g}x above it to the end of the log ({last:.4g}): the cross-entropy under it "
            f"rose by {math.log(values[start] / lowest):.2f} nats a token."
        )
        return _diverged(step, message, key, lowest)
    return []


def _any_loss_absurd(trace: Trace) -> list[Finding]:
    """A loss of any name (a segmentation head's ``loss_seg1``, a GAN's ``Loss_D``) at or above
    ``LOSS_CEILING``, or a perplexity at or above ``PERPLEXITY_CEILING``: whatever it measures, no
    healthy run logs one."""
    judged = level_losses(trace)
    keys = logged_keys(trace)
    limits = [(k, LOSS_CEILING, "the weights diverged") for k in keys if names_a_loss(k) and k not in judged]
    limits += [(k, PERPLEXITY_CEILING, _PERPLEXED) for k in _perplexities(trace)]
    found = (above_ceiling("loss_divergence", k, series(trace, k), top, k, why) for k, top, why in limits)
    first = min((f for f in found if f is not None), key=lambda f: f.step, default=None)
    return [first] if first else []


def _perplexities(trace: Trace) -> list[str]:
    """The perplexities logged (``ppl``, ``valid/ppl``, ``Validation perplexity``)."""
    return [k for k in logged_keys(trace) if _is_perplexity(k)]


def _is_perplexity(key: str) -> bool:
    return key.lower().endswith(("ppl", "perplexity"))


# ln of float32's largest number: a perplexity, exp of the loss, is infinite past it
_EXP_OVERFLOW = math.log(3.4028234663852886e38)


def overflowed_loss(record: dict, key: str) -> str | None:
    """The loss of ``record`` whose exponential its infinite perplexity ``key`` is: a finite loss
    above ln of float32's largest number (OpenNMT-tf's ``loss = 148890.718750 ; perplexity =
    inf``), no NaN or Inf the model computed but a number too large to exponentiate."""
    if not _is_perplexity(key) or record.get(key) != math.inf:
        return None
    return next(
        (
            k
            for k, v in record.items()
            if names_a_loss(k) and isinstance(v, int | float) and _EXP_OVERFLOW < v < math.inf
        ),
        None,
    )


def _perplexity_overflowed(trace: Trace) -> list[Finding]:
    """A perplexity infinite as the exponential of a loss too large for it: the loss diverged."""
    for key in _perplexities(trace):
        values = column(trace, key)
        infinite = (i for i, v in enumerate(values) if v == math.inf) if math.inf in values else ()
        found = next(((i, loss) for i in infinite if (loss := overflowed_loss(trace.steps[i], key))), None)
        if found is None:
            continue
        at, loss = found
        record, step = trace.steps[at], step_of(trace.steps[at], at)
        message = (
            f"{key} is inf at step {step}, the exponential of {loss} = {record[loss]:.6g}, a "
            f"cross-entropy above {_EXP_OVERFLOW:.1f} nats that no uniform guess reaches: the "
            "weights diverged."
        )
        return [Finding("loss_divergence", step, "error", message, {"key": loss, "value": record[loss]})]
    return []


_PERPLEXED = (
    "a cross-entropy above 27 nats a token, twice any vocabulary's uniform guess: the weights diverged"
)


def held_out_losses(trace: Trace) -> tuple[str, ...]:
    """The losses logged on held-out data (``val_loss``, ``validation loss``, ``valid/loss``,
    ``eval_loss``, ``test loss``): not trained on, but scored by the same outputs."""
    return tuple(key for key in logged_keys(trace) if names_a_loss(key) and HELD_OUT_KEY.match(key.lower()))


# a held-out split's key, lower case ("val_loss", "eval/acc", MXNet's "Validation-accuracy")
HELD_OUT_KEY = re.compile(r"(?:val|valid|validation|eval|evaluation|test)(?:[/_ .\-]|$)")


# a loss named for what it computes: TF DeepLab's "cross_entropy", Marian's "cross-entropy"
_CROSS_ENTROPY = frozenset({"cross_entropy", "cross-entropy", "crossentropy", "xent"})
# a boosting library's evaluation of a data set, the objective it minimises: XGBoost's "train-rmse",
# "eval-logloss", LightGBM's "valid_0's l2" (read "valid_0/l2"), "training/binary_logloss"
_BOOSTED = re.compile(r"(?<=[\w.])[-/](?:rmse|mse|mae|l1|l2|logloss|binary_logloss|multi_logloss|mlogloss)$")


def names_a_loss(key: str) -> bool:
    """A metric named a loss, whatever its kind (``actor/loss``, ``softmax_loss``, ``Loss_D``,
    BasicSR's ``l_g_pix`` and ``l_identity``: GFPGAN, Real-ESRGAN; ``cross_entropy``; a booster's
    ``train-rmse``); not a run's best so far (fairseq's ``best_loss``), held by construction
    between improvements."""
    full = key.lower()
    low = full.rsplit("/", 1)[-1]
    named = low.endswith("loss") or low.startswith(("loss_", "l_")) or low in _CROSS_ENTROPY
    named = named or _BOOSTED.search(full) is not None
    return named and not low.startswith("best")


def _level_left(key: str, points: list[tuple[int, float]]) -> list[Finding]:
    """The running median risen ``DIVERGENCE_FACTOR`` times its early-run level (an error), else
    :func:`_loss_jump`."""
    rise = shift(
        points,
        lambda v, base: v > DIVERGENCE_FACTOR * base,
        stat=statistics.median,
        min_points=2 * SUSTAIN + 3,
        positive_base=True,
    )
    if rise is None:
        return _loss_jump(key, points)
    peak = max(rise.running)
    message = (
        f"{key} diverges from step {rise.step}: its running median reaches {peak:.3g}, "
        f"{peak / rise.base:.1f}x the early-run level {rise.base:.3g}."
    )
    return [rise.finding("loss_divergence", "error", message, key=key, baseline=rise.base, peak=peak)]


def _loss_jump(key: str, points: list[tuple[int, float]]) -> list[Finding]:
    """The first step, within the first ``WINDOW`` values, from which the next ``SUSTAIN`` values
    (or, in a shorter paste, every value to its end, two at least: three records of a run that
    left its level) all exceed ``DIVERGENCE_FACTOR`` times the median of every value before it
    (a positive one): a warning, as its level rests on few values; an error where the loss then
    stays frozen at one value (:func:`_frozen`)."""
    values = [v for _, v in points]
    for i in range(1, min(WINDOW, len(values) - min(SUSTAIN, 2)) + 1):
        before = statistics.median(values[:i])
        after = min(values[i : i + SUSTAIN])
        if before > 0 and after > DIVERGENCE_FACTOR * before:
            step = points[i][0]
            frozen = _frozen(values[i:])
            message = f"{key} jumps at step {step} from {before:.3g} to {values[i]:.3g} and " + (
                f"stays at exactly {values[i]:.6g} on all {len(values) - i} records to the end: the "
                "net saturated (a loss no update moves any more), it diverged."
                if frozen
                else f"stays above {after:.3g} ({after / before:.1f}x what came before): the run left its "
                "level."
            )
            severity = "error" if frozen else "warning"
            return _diverged(step, message, key, before, severity)
    return _last_record_jump(key, points) or _jump_below_zero(key, points)


# -ln of the smallest normal float32 / float64: a softmax loss that clamps the label's probability
# there instead of taking log(0) (caffe's SoftmaxWithLoss prints "loss = 87.3365")
CLAMPED_LOSSES = (-math.log(1.1754943508222875e-38), -math.log(2.2250738585072014e-308))


def clamped(value: float) -> bool:
    """Whether a loss is printed at a softmax's clamp (:data:`CLAMPED_LOSSES`)."""
    near = 87 < value < 88 or 708 < value < 709  # the comparisons first: every loss passes here
    return near and any(math.isclose(value, clamp, rel_tol=1e-5) for clamp in CLAMPED_LOSSES)  # as printed


def first_clamped(trace: Trace, key: str) -> int | None:
    """The index in ``series(trace, key)`` of its first value at a softmax's clamp, or ``None``;
    found once for the rules that read it (a pass over every value of every loss: the range
    tested before a call)."""

    def scan() -> int | None:
        return next((i for i, (_, v) in enumerate(series(trace, key)) if 87 < v < 709 and clamped(v)), None)

    return shared(trace, ("clamped", key), scan)


def _jump_to_clamp(trace: Trace) -> list[Finding]:
    """A loss that jumps to a softmax's clamp (:func:`clamped`) from ``DIVERGENCE_FACTOR`` times
    below it, however few records came before: the clamp is an infinite loss, so one record at it
    after a level is the divergence itself (video-caffe's test loss 3.31, then 87.3366 with the
    top-1 accuracy fallen from 0.24 to 0.008)."""
    for key in filter(names_a_loss, logged_keys(trace)):
        points, at = series(trace, key), first_clamped(trace, key)
        before = statistics.median(v for _, v in points[:at]) if at else 0.0
        if at and 0 < DIVERGENCE_FACTOR * before < points[at][1]:
            step, value = points[at]
            message = (
                f"{key} jumps at step {step} from {before:.3g} to {value:g}, -ln of the smallest float, "
                "where a softmax loss clamps a probability of 0: the loss is infinite, the run diverged "
                "(logits blown up: a learning rate too high, no gradient clipping)."
            )
            return _diverged(step, message, key, before, "error")
    return []


def _jump_with_held_out(trace: Trace) -> list[Finding]:
    """A training loss and a held-out loss that both jump ``DIVERGENCE_FACTOR``² times or more
    from one record to the next: a paste of two records has no level to leave, but two losses
    scored on different data that leap together are the weights, not a batch (braindecode on
    seizure data, ``train_loss`` 0.106 and ``valid_loss`` 0.154 in epoch 0, 19.9 and 19.8 in
    epoch 1)."""
    held_out = held_out_losses(trace)
    factor = DIVERGENCE_FACTOR**2
    for key in (k for k in level_losses(trace) if k not in held_out):
        jumps = _jumps(series(trace, key), factor)
        for other in held_out:
            both = sorted(jumps.keys() & _jumps(series(trace, other), factor).keys())
            if both:
                step, (before, after) = both[0], jumps[both[0]]
                message = (
                    f"{key} jumps at step {step} from {before:.3g} to {after:.3g} ({after / before:.0f}x), "
                    f"and {other} with it: two losses scored on different data leap together, the weights "
                    "diverged (a learning rate too high, inputs out of scale, no gradient clipping)."
                )
                return _diverged(step, message, key, before)
    return []


def _jumps(points: list[tuple[int, float]], factor: float) -> dict[int, tuple[float, float]]:
    """Each step at which a positive value is ``factor`` times or more the one before it: the
    value before and the value at it."""
    return {b[0]: (a[1], b[1]) for a, b in itertools.pairwise(points) if a[1] > 0 and b[1] >= factor * a[1]}


def _held_out_jump(trace: Trace) -> list[Finding]:
    """A loss on held-out data that jumps :data:`DIVERGENCE_FACTOR` times above all before it and
    stays there (:func:`_loss_jump`): no overfitting moves a held-out loss that far in a few
    records (a custom LightGBM objective, ``valid_0's l2`` 20996 → 933870 → 3.01e+09)."""
    for key in held_out_losses(trace):
        found = _loss_jump(key, series(trace, key))
        if found:
            return found
    return []


def _frozen(after: list[float]) -> bool:
    """A jumped loss that holds one value exactly on ``SUSTAIN`` or more records to the end of the
    log: a training loss moves with every batch, so one that repeats to the last digit is pinned
    at a ceiling (caffe#6047: 87.3365 = −log(FLT_MIN), the softmax loss of a probability that
    underflowed, on every record after the jump), whatever the few values before it say."""
    return len(after) >= SUSTAIN and len(set(after)) == 1


def _last_record_jump(key: str, points: list[tuple[int, float]]) -> list[Finding]:
    """A paste that ends on a loss ``DIVERGENCE_FACTOR``² times the median of the ``SUSTAIN`` or
    more values before it (a positive one): one record is no level yet, but a user who stops the
    paste where the loss exploded shows no more of it, and a jump that far is no noise."""
    values = [v for _, v in points[-WINDOW - 1 :]]
    if len(values) <= SUSTAIN:
        return []
    before, last = statistics.median(values[:-1]), values[-1]
    if not before > 0 or last <= DIVERGENCE_FACTOR**2 * before:
        return []
    step = points[-1][0]
    message = (
        f"{key} jumps at step {step}, the last record, from {before:.3g} to {last:.3g} "
        f"({last / before:.0f}x what came before): the paste ends as the run leaves its level."
    )
    return _diverged(step, message, key, before)


def _jump_below_zero(key: str, points: list[tuple[int, float]]) -> list[Finding]:
    """A loss held at or below 0 (a flow's or a VAE's negative log-likelihood: no ratio to such a
    level means anything) that jumps on one record by ``DIVERGENCE_FACTOR``² times the larger of
    its level's size and its range over the ``WINDOW`` records before, and whose next ``SUSTAIN``
    records (two at least, to the end of a shorter paste) all stay above the highest of those:
    the run did not come back to where it was (waveglow#38: −5.6 … −4.7, then 40490, then −3.5 …
    −1.1). A healthy run's lone spike falls back within its range."""
    values = [v for _, v in points]
    if not values or min(values) > 0:  # no record at or below 0: no window's median is
        return []
    for i in range(SUSTAIN, len(values) - 2):
        held = values[max(0, i - WINDOW) : i]
        level, top = statistics.median(held), max(held)
        scale = max(abs(level), top - min(held))
        after = values[i + 1 : i + 1 + SUSTAIN]
        if level <= 0 and values[i] - level > DIVERGENCE_FACTOR**2 * scale and min(after) > top:
            step = points[i][0]
            message = (
                f"{key} jumps at step {step} from its level {level:.3g} to {values[i]:.3g} and does not "
                f"come back: the {len(after)} records after stay above {top:.3g}, the highest before it."
            )
            return _diverged(step, message, key, level)
    return []


def _accuracy_held(trace: Trace) -> bool:
    """Whether an accuracy logged beside the loss ends at ``WORSE_ACCURACY`` of where it began or
    above: a model no worse at its data, whatever its loss does (a regulariser's term that
    grows by design: LNL's sparse regularisation, the loss 4.5e6 to 8e6 while test_acc holds 0.53)."""
    for key in accuracies(trace):
        values = [v for _, v in series(trace, key)]
        if len(values) >= SUSTAIN and values[0] > 0 and values[-1] >= WORSE_ACCURACY * values[0]:
            return True
    return False


def _falls_on(trace: Trace, steps: list[int]) -> str | None:
    """An accuracy logged on every one of ``steps`` that falls from each to the next."""
    for key in accuracies(trace):
        logged = dict(series(trace, key))
        values = [logged.get(s) for s in steps]
        if None not in values and all(b < a for a, b in itertools.pairwise(values)):
            return key
    return None


def _climb_start(values: list[float]) -> int:
    """Where the rises in a row that ``values`` end on begin (its last index where it ends on none)."""
    start = len(values) - 1
    while start > 0 and values[start - 1] < values[start]:
        start -= 1
    return start


def _climb_to_end(trace: Trace, key: str, points: list[tuple[int, float]]) -> list[Finding]:
    """A paste that ends on ``SUSTAIN`` or more rises in a row from the lowest loss of the log to
    ``DIVERGENCE_FACTOR`` times it: a language-modelling loss that learned, then climbs back
    toward where it started (entrenar#274: 1.43 → 5.82 → 7.05 → 10.03, the random baseline
    11.93), record after record; or from within the log's range, each rise a new high and the
    last ``CLIMB_OVER_RANGE`` times the highest before the climb (a TF2 detector at 1.19–1.44,
    then 1.77, 2.16, 2.37); or ``STEADY_CLIMB`` rises in a row to ``CLIMB_OVER_RANGE`` times
    where they began (CoTNet's 22.9 to 39.5 at a fixed learning rate), unless an accuracy logged
    beside it holds (:func:`_accuracy_held`: a term that grows by design); or ``PAIRED_CLIMB`` rises
    in a row while an accuracy beside it falls on every one (Keras#932's rmsprop run). Not a critic's: its
    temporal-difference loss grows with the values it learns (keras-rl's DDPG, 0.8 → 6.7 while the
    return improves)."""
    values = [v for _, v in points]
    if len(values) <= SUSTAIN:
        return []
    start = _climb_start(values)
    if len(values) - 1 - start < SUSTAIN:
        return []
    trough, before, rises = values[start], values[:start], len(values) - 1 - start
    from_lowest = 0 < trough <= min(values) and values[-1] >= DIVERGENCE_FACTOR * trough
    over_range = (
        len(before) >= SUSTAIN
        and 0 < max(before) < values[start + 1]
        and values[-1] >= CLIMB_OVER_RANGE * max(before)
    )
    steady = rises >= STEADY_CLIMB and trough > 0 and values[-1] >= CLIMB_OVER_RANGE * trough
    steady = steady and not (from_lowest or over_range) and not _accuracy_held(trace)
    falling = (
        _falls_on(trace, [s for s, _ in points[start:]])
        if rises >= PAIRED_CLIMB and not (from_lowest or over_range or steady)
        else None
    )
    if not (from_lowest or over_range or steady or falling):
        return []
    step = points[start + 1][0]
    if from_lowest:
        rise = f"from its lowest {trough:.3g} to {values[-1]:.3g} ({values[-1] / trough:.1f}x)"
    elif over_range:
        rise = (
            f"from {trough:.3g} to {values[-1]:.3g}, {values[-1] / max(before):.1f}x the highest before it "
            f"({max(before):.3g})"
        )
    else:
        rise = f"{rises} rises in a row, from {trough:.3g} to {values[-1]:.3g}"
        rise += f", while {falling} falls on every one" if falling else ""
    message = (
        f"{key} climbs on every record from step {step} to the end of the log, {rise}: the run is "
        "leaving the level it had learned."
    )
    return _diverged(step, message, key, trough)


def check_kl_blowup(trace: Trace) -> list[Finding]:
    """A KL that jumps far above its running median; or, first where it comes earlier, one at or
    above ``KL_CEILING`` on any record (a snapshot of one record has no median to jump from)."""
    key = first_logged(trace, KL_KEYS)
    if key is None:
        return []
    points = series(trace, key)
    why = "the policy left its reference: a blow-up, not a drift"
    absurd = above_ceiling("kl_blowup", key, points, KL_CEILING, "KL to the reference (nats per token)", why)
    jump = _kl_jump(key, points)
    return [min(found, key=lambda f: f.step)] if (found := [f for f in (absurd, jump) if f]) else []


def _kl_jump(key: str, points: list[tuple[int, float]]) -> Finding | None:
    """The first KL above ``KL_BLOWUP_MIN`` nats and ten times the running median before it."""
    for i in range(1, len(points)):
        prev = [v for _, v in points[max(0, i - WINDOW) : i]]
        med = statistics.median(prev)
        step, value = points[i]
        if value > KL_BLOWUP_MIN and value > 10 * max(med, 1e-3):
            return Finding(
                "kl_blowup",
                step,
                "error",
                f"KL to the reference jumps to {value:.3g} nats at step {step} "
                f"(running median {med:.3g}): the policy left the reference in one step.",
                {"key": key, "value": value, "baseline": med},
            )
    return None
