"""``zero_grad`` read from scores that no update changes, where the loss alone cannot say it: every
score a log prints held to its last digit, a held-out evaluation that repeats itself, a
detector's box-regression losses at 0 from the first record."""

from __future__ import annotations

import math
import re

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.rules.frozen import printed_in_text, significant_digits, zero_grad
from moescope.analyze.rules.losses import HELD_OUT_KEY, is_rl, names_a_loss
from moescope.analyze.rules.series import (
    accuracies,
    column,
    finite_rows,
    logged_keys,
    run_from_end,
    series,
    steps_of,
)
from moescope.analyze.rules.thresholds import PINNED_DIGITS, REPLAYED_RUN, SUSTAIN, VANISHED_LR
from moescope.schema import RAW
from moescope.traces import Trace

# a score's name: a loss, an error, an accuracy or what trees and translators report instead
_SCORE = re.compile(r"loss|rmse|mse|mae|error|logloss|auc|acc|ppl|perplexity|f1|bleu|\bl[12]\b", re.I)
_HELD_DIGITS = PINNED_DIGITS + 1  # each held score printed so finely that two agreeing are no chance
# a detector's box-regression loss (mmdetection's loss_rpn_bbox / loss_bbox, detectron2's
# loss_box_reg, PaddleDetection's loss_rpn_reg / loss_bbox_reg, YOLO's box_loss), not a class score
_BOX_LOSS = re.compile(r"bbox|box|rpn_reg", re.I)  # not "loss_reg", a regulariser's term...
# ...but a one-stage detector's pair of a class loss and a regression loss named alike is boxes
# and classes (Yet-Another-EfficientDet's "Cls loss: 0.03543. Reg loss: 0.00000.", pytorch-retinanet's
# "Classification loss" and "Regression loss")
_REG_LOSS = re.compile(r"reg(?:ression)?[ _]loss", re.I)
_CLS_LOSS = re.compile(r"cl(?:s|assification)[ _]loss", re.I)


def unchanged_scores(trace: Trace) -> list[Finding]:
    """The first of :func:`every_score_held`, :func:`evaluation_repeated`, :func:`boxes_unmatched`
    and :func:`learning_rate_zero` that finds anything. Not in RL, where a reward held is the
    rewards'."""
    if is_rl(trace):
        return []
    found = every_score_held(trace) or evaluation_repeated(trace) or boxes_unmatched(trace)
    return found or learning_rate_zero(trace)


def _scores(trace: Trace) -> list[str]:
    return [key for key in logged_keys(trace) if _SCORE.search(key) and "best" not in key.lower()]


def every_score_held(trace: Trace) -> list[Finding]:
    """Two or more scores (losses, errors, accuracies) of different values, each one not 0 printed
    with ``PINNED_DIGITS + 1`` significant digits or more, every one held to its last digit on the
    ``SUSTAIN`` or more records a log ends on: outputs that no update changes (XGBoost with a custom
    objective whose gradients never reach the booster, xgboost#8014: ``train-rmse:180.26208`` and
    three more scores, round after round; PaddleOCR's text detector, ``loss: 1.000000`` beside
    ``loss_shrink_maps: 0.000000``, its Dice term at 1: nothing predicted). Where some are 0, a
    loss must be among the others: an accuracy at 1 beside a loss at 0 is a model that has learned
    its training set. One score alone is :mod:`~moescope.analyze.rules.frozen`'s to judge, on more
    records."""
    # the scores the last record logs (a paste that ends before its epoch's test line: DeepLung's
    # "tracc" and "gbtacc" held, its last "teacc" not printed yet)
    keys = [key for key in _scores(trace) if column(trace, key)[-1] is not None]
    if len(keys) < 2:
        return []
    columns = [column(trace, key) for key in keys]
    last = [values[-1] for values in columns]
    if any(not isinstance(v, int | float) or not math.isfinite(v) for v in last) or len(set(last)) < 2:
        return []  # one number under two names (caffe's loss and its softmax_loss) is one score
    if 0 in last and not any(v and names_a_loss(key) for key, v in zip(keys, last, strict=True)):
        return []
    rows = list(zip(*columns, strict=True))
    start = run_from_end(rows, lambda row: list(row) == last)
    steps = steps_of(trace)[start:]
    if len(steps) < SUSTAIN or any(v and _digits(trace, steps, v) < _HELD_DIGITS for v in last):
        return []
    named = _named(keys, last)
    message = (
        f"Every score the log prints holds one value to its last digit on {len(steps)} records, from step "
        f"{steps[0]} ({named}): the model's outputs are the same after every update, so no update reaches "
        "it (a custom objective whose gradients are zero or never applied, frozen weights, a learning "
        "rate of 0)."
    )
    return [zero_grad(steps, message, key=keys[0], value=last[0], scores=keys)]


def _named(keys: list[str], values: list[float]) -> str:
    """``key value, …`` as a finding quotes the scores it rests on."""
    return ", ".join(f"{key} {value:.10g}" for key, value in zip(keys, values, strict=True))


def _digits(trace: Trace, steps: list[int], value: float) -> int:
    """The significant digits ``value`` is printed with on the records of ``steps``: its own, or
    its text's (``1.000000`` reads back as 1.0)."""
    return max(significant_digits(value), printed_in_text(trace, [(s, value) for s in steps])[0])


def evaluation_repeated(trace: Trace) -> list[Finding]:
    """Two or more held-out scores, each printed with ``PINNED_DIGITS`` significant digits or
    more, that repeat to the last digit on every evaluation (two or more, on records of their own
    among the training records, at most half of the records, or on lines of their own): a model
    the updates between them did not change, evaluated twice on the same data (OpenNMT-py#966:
    ``Validation perplexity: 56.168`` and ``Validation accuracy: 35.9623`` 130,000 steps apart,
    the learning rate printed 0.00000; PointNet++'s test accuracies 0.040453 and 0.025000,
    epoch after epoch). One held-out accuracy alone does it on ``REPLAYED_RUN`` evaluations or
    more, printed with a digit more: a model that gives one answer whatever its input, scoring the
    share of that class in the held-out set (MXNet's ``Validation-accuracy=0.110204`` epoch after
    epoch, a tutorial's ``Accuracy: 66.29629629629629%``)."""
    keys = [key for key in _scores(trace) if HELD_OUT_KEY.match(key.lower())]
    evaluated = [series(trace, key) for key in keys]
    steps = [s for s, _ in evaluated[0]] if evaluated else []
    alone = len(keys) == 1 and keys[0] in accuracies(trace) and len(steps) >= REPLAYED_RUN
    if (len(keys) < 2 and not alone) or len(steps) < 2:
        return []
    if 2 * len(steps) > len(trace.steps) and not _printed_apart(trace, keys):
        return []
    for points in evaluated:
        values = {v for _, v in points}
        if [s for s, _ in points] != steps or len(values) != 1:
            return []
        (value,) = values
        if value == 0 or _digits(trace, steps, value) < PINNED_DIGITS + (1 if alone else 0):
            return []
    named = _named(keys, [points[0][1] for points in evaluated])
    one_answer = (
        " (an accuracy held so is the share of one class in the held-out set: a model that gives that "
        "answer whatever its input)"
        if alone
        else ""
    )
    message = (
        f"The held-out evaluation repeats itself to the last digit at all {len(steps)} evaluations, "
        f"from step {steps[0]} to step {steps[-1]} ({named}): the updates between them did not change "
        f"the model{one_answer} (a learning rate decayed or set to 0, frozen weights, a checkpoint "
        "evaluated instead of the model in training)."
    )
    return [zero_grad(steps, message, key=keys[0], scores=keys)]


def _printed_apart(trace: Trace, held_out: list[str]) -> bool:
    """Whether every record that logs ``held_out`` prints it on lines whose decimal numbers are
    all held-out values (yanx27's PointNet++: ``Test Instance Accuracy: 0.040453, Class Accuracy:
    0.025000`` under its epoch's banner), not on a training line that carries the last evaluation
    until the next (``step 7 loss 2.1 val_loss 2.75``)."""
    for rec in trace.steps:
        if held_out[0] not in rec:
            continue
        values = {rec.get(key) for key in held_out}
        lines = [
            line for line in str(rec.get(RAW) or "").splitlines() if any(key in line for key in held_out)
        ]
        if not lines or any(float(n) not in values for line in lines for n in _DECIMAL.findall(line)):
            return False
    return True


_DECIMAL = re.compile(r"(?<![\w.])[-+]?\d*\.\d+(?:[eE][-+]?\d+)?")


def boxes_unmatched(trace: Trace) -> list[Finding]:
    """A detector's box-regression loss at exactly 0 on every record, two or more (each a mean over
    a logging interval), while a classification loss beside it is not: no proposal or anchor was
    matched to a ground-truth box, so the box heads learn nothing (mmdetection#2744's
    ``loss_rpn_bbox: 0.0000, loss_bbox: 0.0000`` from the first record on a custom dataset;
    PaddleDetection's ``loss_bbox_reg``, GFL's ``loss_bbox: 0.000000 loss_dfl: 0.000000`` at
    iterations 60 and 80; Yet-Another-EfficientDet's ``Reg loss`` beside its ``Cls loss``)."""
    losses = [key for key in logged_keys(trace) if names_a_loss(key)]
    paired = any(_CLS_LOSS.fullmatch(key) for key in losses)
    boxes = [
        key
        for key in losses
        if (_BOX_LOSS.search(key) or (paired and _REG_LOSS.fullmatch(key))) and "cls" not in key.lower()
    ]
    others = [key for key in losses if key not in boxes]
    for key in boxes:
        values = column(trace, key)
        if len(values) < 2 or any(v != 0 for v in values):
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


# the learning rate as a line prints it, and a held-out record's tag (its learning rate is no step's)
# (a quoted name, a dict's or a JSON record's, has its value printed as Python's repr: "0.0" is 0)
_LR_TEXT = re.compile(
    r"(?:\blr|learning[_ ]rate)(?P<quoted>['\"])?\s*+(?:[:=]\s*+)?\[?\s*"
    r"(?P<value>[-+]?\d[\d.]*(?:[eE][-+]?\d+)?)",
    re.I,
)
_HELD_OUT_RECORD = re.compile(r"\b(?:val|valid|validation|eval|evaluation|test)\b\s*[,:\]|]", re.I)
_FINE_ZERO = 8  # decimals a zero learning rate is printed with to be 0, not a small one rounded (a
# warm-up's first rates print "lr: 0.000000" in MetricLogger's six decimals: VideoMAE's 1e-8)


def learning_rate_zero(trace: Trace) -> list[Finding]:
    """A learning rate of exactly 0 on the ``SUSTAIN`` or more training records a log ends on,
    printed so that no small rate rounds to it (in E-notation, ``0.000e+00``, to ``_FINE_ZERO``
    decimals or more, or as a repr, ``{'learning_rate': 0.0}``), or one below ``VANISHED_LR``: no
    update changes the weights, whatever the loss does (PaddleSpeech#675: ``lr: 0.00000000`` from
    the second epoch on, the loss bouncing about 15; Informer2020#469: 7e-280, halved each epoch).
    A rate printed ``0.00000`` may be 4e-6, but not after a rate already vanished (ParlAI's table,
    ``1.565e-31`` and then ``0``, Adafactor's relative step driven to nothing); a held-out record's
    rate is no step's."""
    values, logged = column(trace, S.LR), finite_rows(trace, S.LR)
    rows = logged[run_from_end(logged, lambda i: 0 <= values[i] < VANISHED_LR) :]
    vanished = next((k for k, i in enumerate(rows) if values[i] > 0), len(rows))  # a zero after it is one
    unsure = [i for i in rows[:vanished] if values[i] == 0]
    if len(rows) < SUSTAIN or not all(_zero_printed_finely(trace.steps[i].get(RAW)) for i in unsure):
        return []
    every = steps_of(trace)
    steps = [every[i] for i in rows]
    last = values[rows[-1]]
    rate = "0" if last == 0 else f"{last:.2g}, below {VANISHED_LR:g},"
    message = (
        f"The learning rate is {rate} on {len(steps)} records, from step {steps[0]}: no update changes "
        "the weights, so nothing is learned (a schedule decayed to 0 or not yet started, a warm-up "
        "longer than the run, a scheduler stepped once a batch where it counts epochs)."
    )
    return [zero_grad(steps, message, key=S.LR, value=last)]


def _zero_printed_finely(raw: object) -> bool:
    """Whether a training record's line prints its learning rate as an exact 0."""
    if not isinstance(raw, str) or _HELD_OUT_RECORD.search(raw[:80]):
        return False
    found = _LR_TEXT.search(raw)
    if found is None:
        return False
    text = found["value"].lower()
    mantissa, _, exponent = text.partition("e")
    exact = found["quoted"] or exponent or len(mantissa.partition(".")[2]) >= _FINE_ZERO
    return float(text) == 0 and bool(exact)
