"""``zero_grad`` read from scores that no update changes, where the loss alone cannot say it: every
score a log prints held to its last digit, a held-out evaluation that repeats itself, a
detector's box-regression losses at 0 from the first record."""

from __future__ import annotations

import re

from moescope.analyze.findings import Finding
from moescope.analyze.rules.frozen import significant_digits, zero_grad
from moescope.analyze.rules.losses import HELD_OUT_KEY, is_rl, names_a_loss
from moescope.analyze.rules.series import column, logged_keys, run_from_end, series, steps_of
from moescope.analyze.rules.thresholds import PINNED_DIGITS, SUSTAIN
from moescope.traces import Trace

# a score's name: a loss, an error, an accuracy or what trees and translators report instead
_SCORE = re.compile(r"loss|rmse|mse|mae|error|logloss|auc|acc|ppl|perplexity|f1|bleu|\bl[12]\b|cost", re.I)
_HELD_DIGITS = PINNED_DIGITS + 1  # each held score printed so finely that two agreeing are no chance
# a detector's box-regression loss (mmdetection's loss_rpn_bbox / loss_bbox, detectron2's
# loss_box_reg, PaddleDetection's loss_rpn_reg / loss_bbox_reg, YOLO's box_loss), not a class score
_BOX_LOSS = re.compile(r"bbox|box|rpn_reg", re.I)  # not "loss_reg", a regulariser's term


def unchanged_scores(trace: Trace) -> list[Finding]:
    """The first of :func:`every_score_held`, :func:`evaluation_repeated` and
    :func:`boxes_unmatched` that finds anything. Not in RL, where a reward held is the rewards'."""
    if is_rl(trace):
        return []
    return every_score_held(trace) or evaluation_repeated(trace) or boxes_unmatched(trace)


def _scores(trace: Trace) -> list[str]:
    return [key for key in logged_keys(trace) if _SCORE.search(key) and "best" not in key.lower()]


def every_score_held(trace: Trace) -> list[Finding]:
    """Two or more scores (losses, errors, accuracies) of different values, each printed with
    ``PINNED_DIGITS + 1`` significant digits or more and none 0, every one held to its last digit
    on the ``SUSTAIN`` or more records a log ends on: outputs that no update changes (XGBoost with
    a custom objective whose gradients never reach the booster, xgboost#8014:
    ``train-rmse:180.26208`` and three more scores, round after round). One score alone is
    :mod:`~moescope.analyze.rules.frozen`'s to judge, on more records; a 0 held is a term
    switched off."""
    keys = _scores(trace)
    if len(keys) < 2:
        return []
    columns = [column(trace, key) for key in keys]
    last = [values[-1] for values in columns]
    if any(not isinstance(v, int | float) or v == 0 or significant_digits(v) < _HELD_DIGITS for v in last):
        return []
    if len(set(last)) < 2:  # one number under two names (caffe's loss and its softmax_loss): one score
        return []
    rows = list(zip(*columns, strict=True))
    start = run_from_end(rows, lambda row: list(row) == last)
    if len(rows) - start < SUSTAIN:
        return []
    steps = steps_of(trace)[start:]
    named = ", ".join(f"{key} {value:.10g}" for key, value in zip(keys, last, strict=True))
    message = (
        f"Every score the log prints holds one value to its last digit on {len(steps)} records, from step "
        f"{steps[0]} ({named}): the model's outputs are the same after every update, so no update reaches "
        "it (a custom objective whose gradients are zero or never applied, frozen weights, a learning "
        "rate of 0)."
    )
    return [zero_grad(steps, message, key=keys[0], value=last[0], scores=keys)]


def evaluation_repeated(trace: Trace) -> list[Finding]:
    """Two or more held-out scores, each printed with ``PINNED_DIGITS`` significant digits or
    more, that repeat to the last digit on every evaluation (two or more, on records of their own
    among the training records: at most half of the records): a model the updates between them
    did not change, evaluated twice on the same data (OpenNMT-py#966: ``Validation perplexity:
    56.168`` and ``Validation accuracy: 35.9623`` 130,000 steps apart, the learning rate printed
    0.00000)."""
    keys = [key for key in _scores(trace) if HELD_OUT_KEY.match(key.lower())]
    evaluated = [series(trace, key) for key in keys]
    steps = [s for s, _ in evaluated[0]] if evaluated else []
    if len(keys) < 2 or len(steps) < 2 or 2 * len(steps) > len(trace.steps):
        return []
    for points in evaluated:
        values = {v for _, v in points}
        if [s for s, _ in points] != steps or len(values) != 1:
            return []
        (value,) = values
        if value == 0 or significant_digits(value) < PINNED_DIGITS:
            return []
    named = ", ".join(f"{key} {points[0][1]:.10g}" for key, points in zip(keys, evaluated, strict=True))
    message = (
        f"The held-out evaluation repeats itself to the last digit at all {len(steps)} evaluations, "
        f"from step {steps[0]} to step {steps[-1]} ({named}): the updates between them did not change "
        "the model (a learning rate decayed or set to 0, frozen weights, a checkpoint evaluated "
        "instead of the model in training)."
    )
    return [zero_grad(steps, message, key=keys[0], scores=keys)]


def boxes_unmatched(trace: Trace) -> list[Finding]:
    """A detector's box-regression loss at exactly 0 on every record, ``SUSTAIN`` or more, while
    a classification loss beside it is not: no proposal or anchor was matched to a ground-truth
    box, so the box heads learn nothing (mmdetection#2744's ``loss_rpn_bbox: 0.0000, loss_bbox:
    0.0000`` from the first record on a custom dataset; PaddleDetection's ``loss_bbox_reg``)."""
    losses = [key for key in logged_keys(trace) if names_a_loss(key)]
    boxes = [key for key in losses if _BOX_LOSS.search(key) and "cls" not in key.lower()]
    others = [key for key in losses if key not in boxes]
    for key in boxes:
        values = column(trace, key)
        if len(values) < SUSTAIN or any(v != 0 for v in values):
            continue
        if not any(isinstance(v, int | float) and v > 0 for other in others for v in column(trace, other)):
            continue
        steps = steps_of(trace)
        message = (
            f"{key} is exactly 0 on all {len(steps)} records, from step {steps[0]}, while the class "
            "losses beside it are not: no anchor or proposal was matched to a ground-truth box, so the "
            "box heads learn nothing (annotations empty or in another format, boxes out of the image, "
            "category ids the config does not list)."
        )
        return [zero_grad(steps, message, key=key, value=0)]
    return []
