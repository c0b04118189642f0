"""A language-modelling loss that no update moves: ``zero_grad`` read from the loss alone, for
logs that print no gradient norm (or a norm that a frozen model still has)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from moescope.analyze.findings import Finding
from moescope.analyze.rules.losses import lm_losses
from moescope.analyze.rules.series import series
from moescope.analyze.rules.thresholds import FINE_DIGITS, PINNED_DIGITS, PINNED_SPREAD, REPLAYED_RUN, WINDOW
from moescope.traces import Trace


def unmoved_loss(trace: Trace) -> list[Finding]:
    """A loss pinned at one value on every record, or one that replays its own earlier values."""
    return _pinned(trace) or _replayed(trace)


def _pinned(trace: Trace) -> list[Finding]:
    """A language-modelling loss that holds one value other than 0 on every record of a log of
    ``WINDOW`` or more, printed with ``PINNED_DIGITS`` significant digits or more: to its last
    digit, or, printed with ``FINE_DIGITS`` or more, to within ``PINNED_SPREAD`` of it. A loss
    moves with every batch, so one that never does is not computed from what the model learns
    (constant outputs: 10.8259 is the log of a 50,304-token vocabulary, the loss of a uniform
    guess; DINO's 11.0903 of its 65,536 prototypes, moving in the seventh digit). A loss that
    jumps to a value and stays there is ``loss_divergence``'s."""
    for key in lm_losses(trace):
        points = series(trace, key)
        first = points[0][1] if points else 0
        if len(points) < WINDOW or first == 0 or significant_digits(first) < PINNED_DIGITS:
            continue
        values = [v for _, v in points]
        fine = max(significant_digits(v) for v in values[:WINDOW]) >= FINE_DIGITS
        if max(values) - min(values) <= (abs(first) * PINNED_SPREAD if fine else 0):
            steps = [s for s, _ in points]
            held = f"exactly {first:.6g}" if min(values) == max(values) else f"{first:#.5g} to 5 digits"
            message = (
                f"{key} is {held} on all {len(points)} records, from step {steps[0]}: a "
                "loss that no batch moves is not computed from what the model learns (constant "
                "outputs, an output layer zeroed or detached from the graph, frozen weights)."
            )
            return [zero_grad(steps, message, key=key, value=first)]
    return []


def _replayed(trace: Trace) -> list[Finding]:
    """A language-modelling loss whose last ``REPLAYED_RUN`` records or more repeat, value for value
    and to the last digit (``PINNED_DIGITS`` significant ones or more, not all one value), the
    records a fixed number of steps before them: the same batches scored the same, so the model
    did not change in between (TRACE#5's LoRA run repeats its epoch's losses epoch after epoch,
    its adapters never updated). A loss that learns does not repeat five finely printed values in
    a row; the repeat must reach the end of the log, so only the tail is looked up."""
    for key in lm_losses(trace):
        points = series(trace, key)
        values = np.array([v for _, v in points], dtype=float)
        period = _period_of_tail(values)
        if period is None:
            continue
        same = values[period:] == values[:-period]
        held = len(same) - int(np.flatnonzero(~same)[-1]) - 1 if not same.all() else len(same)
        first = len(values) - held - period
        steps = [s for s, _ in points[first:]]
        message = (
            f"{key} repeats, to the last digit, its values of {period} steps before on its last {held} "
            f"records (from step {points[first + period][0]}): the same batches scored the same, so the "
            "model did not change from step "
            f"{steps[0]} on (weights never updated: adapters not trained, an optimizer that holds no "
            "parameter, a learning rate of 0)."
        )
        return [zero_grad(steps, message, key=key, period=period, repeated=held)]
    return []


def _period_of_tail(values: np.ndarray) -> int | None:
    """The shortest distance at which the last ``REPLAYED_RUN`` values appear earlier, value for
    value, where they are finite, printed finely (one printing precision for all: the most digits
    among them) and not all one value."""
    tail = values[-REPLAYED_RUN:]
    if len(values) <= REPLAYED_RUN or not np.isfinite(tail).all() or len(set(tail.tolist())) == 1:
        return None
    if max(significant_digits(v) for v in tail.tolist()) < PINNED_DIGITS:  # printed: 0.9670 reads 0.967
        return None
    earlier = sliding_window_view(values[:-1], REPLAYED_RUN)
    found = np.flatnonzero((earlier == tail).all(axis=1))
    return None if not len(found) else len(values) - REPLAYED_RUN - int(found[-1])


def significant_digits(value: float) -> int:
    """The significant digits of ``value`` as Python prints it (``10.8259``: 6, ``2.3``: 2)."""
    return len(repr(abs(value)).split("e")[0].replace(".", "").lstrip("0"))


def zero_grad(steps: list[int], message: str, **evidence: Any) -> Finding:
    return Finding("zero_grad", steps[0], "warning", message, {**evidence, "steps": steps})
