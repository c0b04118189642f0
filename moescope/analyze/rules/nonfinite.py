"""``nonfinite``: the first step with a NaN/±Inf, the metric family that went first, and losses
that vanish from a step (a framework that drops a NaN loss). An error, but a warning when only one
step's gradients went non-finite and the run went on at once (a skipped update). The message
calls the loss family "policy loss" only in an RL log: an SFT ``eval_loss`` or a detector's
``giou_loss`` is a loss, no policy's."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from itertools import compress
from typing import Any

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.readers._rows import wholly_skipped
from moescope.analyze.rules.losses import first_clamped, is_rl, names_a_loss, overflowed_loss
from moescope.analyze.rules.series import (
    column,
    is_number,
    logged_key_set,
    logged_keys,
    scaler_skipped,
    series,
    step_of,
    steps_of,
)
from moescope.analyze.rules.thresholds import DIVERGENCE_FACTOR, SUSTAIN
from moescope.traces import Trace

# metric families in the order a training step computes them (forward before backward)
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "log-prob/KL",
        (S.KL, S.PPO_KL, S.LOGPROB_MISMATCH, S.KL_LOSS, S.ENTROPY),
    ),
    ("policy loss", (S.ACTOR_LOSS, S.PG_LOSS, S.LM_LOSS, S.LM_LOSS_SPACED)),
    ("critic", (S.VF_LOSS, S.CRITIC_LOSS, S.CRITIC_VALUES)),
    ("gradients", (S.GRAD_NORM, S.CRITIC_GRAD_NORM, S.NONFINITE)),
)
TEXT_ONLY = "the log's text"  # the family of a plain-text read: lines that mention NaN/Inf, no metric
SKIP_KEYS = {S.STEP, S.KIND, S.RAW, *S.TIMING_KEYS}
_REWARD_STATISTICS = {S.REWARD_MEAN, S.REWARD_STD, S.REWARD_MIN, S.REWARD_MAX}
ALWAYS_NUMERIC = (S.ACTOR_LOSS, S.PG_LOSS, S.GRAD_NORM, S.VF_LOSS, S.CRITIC_GRAD_NORM)


def check_nonfinite(trace: Trace) -> list[Finding]:
    """The first non-finite step (isolated or persistent), then any suspected non-finite loss."""
    bad_steps = _bad_steps(trace)
    findings = [_first_nonfinite(trace, bad_steps)] if bad_steps else _clamped_loss(trace)
    vanished = _vanished_losses(trace, {s for s, _ in bad_steps})
    seen = {s for s, _ in bad_steps} | {s for f in vanished for s in f.evidence["steps"]}
    return findings + vanished + _unlogged_losses(trace, seen)


def _clamped_loss(trace: Trace) -> list[Finding]:
    """A loss at -ln(FLT_MIN) = 87.3365 (or -ln(DBL_MIN) = 708.396): the label's probability
    underflowed to 0 on every sample, and the clamp printed in place of an infinite loss (a
    softmax whose logits blew up: caffe's well-known 87.3365). Reached by a jump from a level the
    log shows, it is ``loss_divergence``'s."""
    for key in filter(names_a_loss, logged_keys(trace)):
        points, at = series(trace, key), first_clamped(trace, key)
        before = [v for _, v in points[:at]] if at is not None else []
        if at is None or (before and points[at][1] > DIVERGENCE_FACTOR * statistics.median(before)):
            continue  # none, or a jump to the clamp: loss_divergence's, which dates and explains it
        step, value = points[at]
        message = (
            f"{key} is {value:g} at step {step}: -ln of the smallest float, where a softmax loss "
            "clamps a probability of 0; the loss is infinite (logits blown up, weights non-finite)."
        )
        return [Finding("nonfinite", step, "error", message, {"key": key, "value": value, "clamped": True})]
    return []


def _bad(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _family(key: str, alerts: Sequence[str] = ()) -> str:
    """The family of a non-finite ``key``; a count of the log's own lines (``health/nonfinite``
    from ``alerts``) is the gradients' only where a line names them (``Loss is NaN or inf.``,
    ``[L1: nan]`` do not)."""
    if key == S.NONFINITE and alerts and not any("grad" in line.lower() for line in alerts):
        return TEXT_ONLY
    for name, keys in FAMILIES:
        if key in keys:
            return name
    if "grad" in key or key == S.NONFINITE:
        return "gradients"
    if key.startswith("critic/"):
        return "critic"
    if "kl" in key or "logprob" in key or "log_prob" in key:
        return "log-prob/KL"
    if "loss" in key:
        return "policy loss"
    return "other"


def _numeric_keys(trace: Trace) -> set[str]:
    """Keys that hold a number on some step (a ``null`` there can stand for NaN), and the
    canonical losses and gradient norms, which are numbers whenever logged: one record with
    ``grad_norm: None`` (TRL's value when every micro-batch was NaN) is decisive."""
    return {
        k
        for k in logged_keys(trace)
        if k not in SKIP_KEYS
        and not _TIMER.search(k)
        and any(map(is_number, (rec.get(k) for rec in trace.steps)))
    } | set(ALWAYS_NUMERIC)


# a clock's reading, no quantity of the training: ESPnet2's optim_step_time is nan (0 / 0) while
# gradient accumulation skips the optimizer, in a healthy run
_TIMER = re.compile(
    r"(?:^|[_/ .])(?:time|timing|elapsed|duration)(?:$|[_/ .(])|_(?:ms|sec|secs)$", re.IGNORECASE
)


def _bad_steps(trace: Trace) -> list[tuple[int, list[str]]]:
    """``(step, non-finite keys)`` of every step with one, fp16 skips of gradients left out."""
    numeric = _numeric_keys(trace)
    bad_steps: list[tuple[int, list[str]]] = []
    for i in _suspects(trace, numeric):
        rec = trace.steps[i]
        keys = [k for k, v in rec.items() if k in numeric and _bad(v) and overflowed_loss(rec, k) is None]
        if rec.get(S.NONFINITE) and S.NONFINITE not in keys:
            keys.append(S.NONFINITE)
        if keys and scaler_skipped(rec) and all(_family(k) == "gradients" for k in keys):  # the scaler's
            continue
        if keys:
            bad_steps.append((step_of(rec, i), keys))
    return bad_steps


def _suspects(trace: Trace, numeric: set[str]) -> list[int]:
    """Where a record may hold a non-finite value: a key at a time over every record (a
    million-step log has a handful of such records; the keys of those are then read in order)."""
    absent = 0.0  # a key the record lacks: not a null
    found = set(compress(range(len(trace.steps)), column(trace, S.NONFINITE)))
    logged = logged_key_set(trace)
    for key in numeric & logged:  # a key no record logs holds nothing non-finite
        if _all_finite(column(trace, key)):  # the shared column: logged by every record, all finite
            continue
        values = [rec.get(key, absent) for rec in trace.steps]
        if not _all_finite(values):
            found.update(compress(range(len(values)), map(_bad, values)))
    return sorted(found)


def _all_finite(column: list[Any]) -> bool:
    """Whether every value is a finite number, tested in C: such a column has nothing
    :func:`_bad` (a ``None``, a string or a huge int stops the test, and the column is read
    value by value)."""
    try:
        return all(map(math.isfinite, column))
    except (TypeError, ValueError, OverflowError):
        return False


def _first_nonfinite(trace: Trace, bad_steps: list[tuple[int, list[str]]]) -> Finding:
    step, keys = bad_steps[0]
    order = [name for name, _ in FAMILIES] + ["other", TEXT_ONLY]
    record = trace.steps[_index_of(trace, step)]
    alerts = str(record.get(S.ALERTS) or "").splitlines()
    plain = trace.header.get("format") == "plain"  # lines that mention NaN/Inf: no metric named
    families = sorted({TEXT_ONLY if plain else _family(k, alerts) for k in keys}, key=order.index)
    later = [s for s, _ in bad_steps[1:]]
    following = next((s for s in steps_of(trace) if s > step), None)  # the next record, however far its step
    persistent = len(later) >= SUSTAIN or bool(later and later[0] == following)
    module = record.get(S.FIRST_NONFINITE_MODULE)
    where = f", first in module {module}" if module else ""
    where += f"; the log says: {alerts[0][:160]!r}" if alerts else ""
    skipped = _skipped_update(trace, step, keys)
    where += (
        "; the optimizer skipped the update (finite loss, learning rate not advancing)" if skipped else ""
    )
    recovered = len(bad_steps) == 1 and _recovered(trace, step, keys)
    where += (
        "; the run recovered at once (the loss stayed finite, the next step's gradients are finite): "
        "an update skipped, as fp16 loss scaling does, not a diverged run"
        if recovered
        else ""
    )
    no_data = all(_reward_statistic(k) for _, bad in bad_steps for k in bad)
    where += (
        "; only episode statistics (rewards, returns, lengths) went non-finite, no loss or gradient "
        "did: a mean over no finished episode (numpy's mean of an empty slice is NaN, which says "
        "nothing of the updates), or rewards the environment or the reward function returned as NaN"
        if no_data
        else ""
    )
    undefined = not no_data and all(_evaluation_score(k) for _, bad in bad_steps for k in bad)
    where += (
        "; only an evaluation score went non-finite, no loss or gradient did: a score undefined on "
        "its data (a ratio of 0 to 0: every prediction one class, every return the same), which "
        "says what the model predicts, not that the updates broke"
        if undefined
        else ""
    )
    empty = not no_data and not undefined and _empty_statistics(trace, bad_steps)
    where += (
        "; every number of the log's first records is NaN, and the same metrics are finite after: "
        "statistics of nothing (a mean over an empty buffer before the first update), not values the "
        "run computed"
        if empty
        else ""
    )
    named = families if is_rl(trace) else ["loss" if f == "policy loss" else f for f in families]
    return Finding(
        "nonfinite",
        step,
        "warning" if recovered or no_data or undefined or empty else "error",
        f"First non-finite value at step {step} in {', '.join(named)} "
        f"({', '.join(sorted(keys)[:4])}){where}; {'persistent' if persistent else 'isolated'}: "
        f"{len(bad_steps)} step(s) with non-finite values.",
        {
            "keys": sorted(keys),
            "families": families,
            "first_family": families[0],
            "module": module,
            "steps": [s for s, _ in bad_steps],
            "persistent": persistent,
            "null_only": all(record.get(k) is None for k in keys if k != S.NONFINITE),
            "skipped_update": skipped,
            "recovered": recovered,
            "rewards_only": no_data,
            "evaluation_only": undefined,
            "empty_statistics": empty,
            "alerts": alerts,
        },
    )


def _empty_statistics(trace: Trace, bad_steps: list[tuple[int, list[str]]]) -> bool:
    """Whether the non-finite records are the log's first ones, every number in them NaN (two or
    more), and the record after them logs those metrics finite: what a learner prints before its
    first update, its statistics means over nothing (rlpyt's ``lossAverage nan``,
    ``gradNormAverage nan``, … until the replay buffer fills). A run that went NaN keeps a finite
    learning rate, step time or count beside its NaN loss, and does not come back. (A paste may cut
    the next record short: two of those metrics or more, each finite, are enough.)"""
    count = len(bad_steps)
    if count >= len(trace.steps) or [s for s, _ in bad_steps] != steps_of(trace)[:count]:
        return False
    keys: set[str] = set()
    for rec in trace.steps[:count]:
        values = {
            k: v for k, v in rec.items() if k not in SKIP_KEYS and not _TIMER.search(k) and is_number(v)
        }
        if len(values) < 2 or not all(isinstance(v, float) and math.isnan(v) for v in values.values()):
            return False
        keys |= set(values)
    after = trace.steps[count]
    logged = [after[k] for k in keys if is_number(after.get(k))]
    return len(logged) >= 2 and all(map(math.isfinite, logged))


def _reward_statistic(key: str) -> bool:
    """A key that averages rewards, returns or episode lengths over episodes or responses: RL
    libraries log NaN there while no episode has finished (ml-agents' ``Mean Reward``, Stable
    Baselines' ``ep_rewmean`` beside its ``eplenmean``, RLlib's ``episode_reward_mean``)."""
    low = key.lower()
    episodic = "reward" in low or "return" in low or _EPISODE_LENGTH.search(low) is not None
    return key in _REWARD_STATISTICS or (episodic and "loss" not in low)


def _evaluation_score(key: str) -> bool:
    """A key that scores predictions against labels (``Kappa``, ``mIoU``, ``f1``, ``precision``,
    ``AUC``, ``mAP``; an RL critic's ``explained_variance``): a ratio whose denominator is 0 where
    every prediction is one class, or every return the same (PaddleSeg's ``Kappa: nan`` beside
    ``mIoU: 0.5000``; stable-baselines' ``explained_variance | nan``)."""
    return _SCORE_NAME.search(key) is not None and not names_a_loss(key)


_SCORE_NAME = re.compile(
    r"kappa|iou|f1|precision|recall|auc|(?:^|[\W_])m?ap(?:[\W_\d]|$)|dice|explained_var", re.IGNORECASE
)
_EPISODE_LENGTH = re.compile(r"ep(?:isode)?_?len")  # eplenmean, ep_len_mean, episode_len_mean


def _skipped_update(trace: Trace, step: int, keys: list[str]) -> bool:
    """A step whose gradients alone went non-finite while the loss stayed finite and the learning
    rate did not move on from the step before: the update was skipped (HF Trainer, verl and
    Megatron skip a non-finite gradient; the scheduler stays)."""
    index = _index_of(trace, step)
    record = trace.steps[index]
    lr, before = record.get(S.LR), trace.steps[index - 1].get(S.LR) if index else None
    return (
        all(_family(k) == "gradients" for k in keys)
        and _finite_loss(record)
        and isinstance(lr, int | float)
        and lr == before
    )


def _index_of(trace: Trace, step: int) -> int:
    """Where ``step``'s record is in ``trace.steps``."""
    return steps_of(trace).index(step)


def _finite_loss(record: dict[str, Any]) -> bool:
    loss = record.get(S.ACTOR_LOSS, record.get(S.PG_LOSS))
    return isinstance(loss, int | float) and math.isfinite(loss)


def _recovered(trace: Trace, step: int, keys: list[str]) -> bool:
    """Gradients alone went non-finite, on one step, with the loss finite there and on the next
    record, whose gradient norm is finite again: had the update been applied, the weights would be
    NaN and so would every later loss, so the step was skipped (an AMP grad scaler, HF Trainer and
    verl skip such an update) and the run went on. mmengine's ``grad_norm: nan`` under fp16 is
    this."""
    index = _index_of(trace, step)
    after = trace.steps[index + 1] if index + 1 < len(trace.steps) else None
    norm = after.get(S.GRAD_NORM) if after else None
    return (
        all(_family(k) == "gradients" for k in keys)
        and _finite_loss(trace.steps[index])
        and after is not None
        and _finite_loss(after)
        and isinstance(norm, int | float)
        and math.isfinite(norm)
    )


def _unlogged_losses(trace: Trace, seen: set[int]) -> list[Finding]:
    """Steps a reader marked ``health/loss_missing`` (a Megatron line that made updates but logs
    no loss: its NaN loss was dropped), not already reported: a suspected non-finite loss, even
    on a one-line excerpt."""
    steps = steps_of(trace)
    missing = [
        steps[i] for i in compress(range(len(steps)), column(trace, S.LOSS_MISSING)) if steps[i] not in seen
    ]
    if not missing:
        return []
    return [
        Finding(
            "nonfinite",
            missing[0],
            "warning",
            f"Suspected non-finite loss at step {missing[0]}: the line logs no loss though the step "
            "made updates (Megatron drops a NaN loss from its line and may still count 0 NaN "
            "iterations).",
            {"key": S.LOSS_MISSING, "suspected": True, "steps": missing},
        )
    ]


def _vanished_losses(trace: Trace, known_bad: set[int]) -> list[Finding]:
    """A loss logged on at least as many steps as it is missing from, missing from a step that
    logs most of the same other metrics (the same kind of record, not an evaluation line) after a
    step that logged it: a suspected non-finite loss. One such step in a two-line excerpt counts;
    a step that made no update at all (:func:`~moescope.analyze.readers._rows.wholly_skipped`) had
    no loss to log."""
    out = []
    n = len(trace.steps)
    for key in (S.ACTOR_LOSS, S.PG_LOSS, S.VF_LOSS):
        if key not in logged_key_set(trace):
            continue
        present = [key in rec for rec in trace.steps]
        if not any(present) or all(present) or 2 * sum(present) < n:
            continue
        peers = set.intersection(*(set(r) for r, p in zip(trace.steps, present, strict=True) if p))
        peers -= {key, *SKIP_KEYS}
        since = present.index(True)  # a loss not yet logged has not vanished (a paste cut before it)
        missing = [
            step_of(rec, i)
            for i, rec in enumerate(trace.steps)
            if i > since and not present[i] and peers and 2 * len(peers & rec.keys()) > len(peers)
        ]
        if missing:  # the steps that made no update, read only where a loss went missing
            skipped = wholly_skipped(steps_of(trace), column(trace, S.SKIPPED))
            missing = [s for s in missing if s not in known_bad and s not in skipped]
        if missing:
            out.append(
                Finding(
                    "nonfinite",
                    missing[0],
                    "warning",
                    f"Suspected non-finite {key} at step {missing[0]}: the field is logged on "
                    f"{sum(present)} of {n} steps but vanishes there (frameworks drop a NaN loss).",
                    {"key": key, "suspected": True, "steps": missing},
                )
            )
    return out
