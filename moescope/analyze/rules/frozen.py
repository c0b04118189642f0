"""A language-modelling loss that no update moves: ``zero_grad`` read from the loss alone, for
logs that print no gradient norm (or a norm that a frozen model still has)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from moescope import schema as S
from moescope._util.numbers import DECIMAL
from moescope.analyze.findings import Finding
from moescope.analyze.rules.losses import (
    HELD_OUT_KEY,
    clamped,
    held_out_losses,
    is_rl,
    lm_losses,
    names_a_loss,
    network_losses,
    network_of,
    own_losses,
)
from moescope.analyze.rules.series import (
    accuracies,
    column,
    is_number,
    logged_keys,
    run_from_end,
    series,
    step_of,
)
from moescope.analyze.rules.thresholds import (
    CERTAIN_SHARE,
    CHANCE_RESOLUTION,
    CHANCE_SPREAD,
    DIVERGENCE_FACTOR,
    FINE_DIGITS,
    FLAT_SHARE,
    GUESS_LOSS_SHARE,
    GUESS_SHARE,
    HALF_DIGITS,
    HALF_HELD,
    ONE_CLASS_SHARE,
    PINNED_DIGITS,
    PINNED_SPREAD,
    PLATEAU_PPL,
    PLATEAU_RECORDS,
    PLATEAU_SPREAD,
    REPLAYED_RUN,
    STUCK_SHARE,
    SUSTAIN,
    WINDOW,
)
from moescope.schema import RAW, STEP
from moescope.traces import Trace


def unmoved_loss(trace: Trace) -> list[Finding]:
    """A loss held at one value on the records a log ends on, one that replays its own earlier
    values there, one held at the loss of a uniform guess, or an accuracy held at 0 beside a loss
    that does not fall."""
    held = _at_clamp(trace) or _pinned(trace) or _replayed(trace) or _recycled(trace)
    held = held or _at_chance(trace) or _near_chance(trace) or _guessing(trace) or _nothing_right(trace)
    held = held or _fell_to_nothing(trace) or _zero_loss_beside_misses(trace)
    held = held or _one_class(trace) or _lm_plateau(trace) or _term_pinned(trace)
    return held or _held_out_at_bound(trace) or _networks_frozen(trace)


def _pinned(trace: Trace) -> list[Finding]:
    """A language-modelling loss that holds one value other than 0 on the ``REPLAYED_RUN`` or more
    records a log ends on, printed with ``PINNED_DIGITS`` significant digits or more: to its last
    digit, or, printed with ``FINE_DIGITS`` or more, to within ``PINNED_SPREAD`` of it. A loss
    moves with every batch, so one that stops moving is no longer computed from what the model
    learns (constant outputs: 10.8259 is the log of a 50,304-token vocabulary, the loss of a
    uniform guess; DINO's 11.0903 of its 65,536 prototypes, moving in the seventh digit; an
    ArcFace head whose loss falls once, then prints 3.6976 batch after batch). A loss that jumps
    ``DIVERGENCE_FACTOR`` times above its median before and stays there is ``loss_divergence``'s."""
    for key in lm_losses(trace):
        points = series(trace, key)
        values = [v for _, v in points]
        printed = printed_in_text(trace, points[-WINDOW:])
        start = _held_from(values, printed=printed)
        beside = None
        if start is None:  # a shorter hold counts where the model's accuracy holds with it, and one
            # printed to a digit less where it does on REPLAYED_RUN records (tensorflow-federated#2820:
            # "loss=0.823, accuracy=0.673" round after round)
            for run, digits in ((SUSTAIN, PINNED_DIGITS), (REPLAYED_RUN, PINNED_DIGITS - 1)):
                start = _held_from(values, run, printed, digits)
                beside = (
                    _held_beside(trace, key, {s for s, _ in points[start:]}, digits)
                    if start is not None
                    else None
                )
                if beside is not None:
                    break
            if beside is None:
                continue
        steps, last = [s for s, _ in points[start:]], values[-1]
        tail = values[start:]
        exact = f"{last:.{printed[1]}f}" if printed[1] else f"{last:.6g}"
        held = f"exactly {exact}" if min(tail) == max(tail) else f"{last:#.5g} to 5 digits"
        held += f" (and {beside} with it)" if beside else ""
        where = _records(len(tail), len(values))
        message = (
            f"{key} is {held} on {where}, from step {steps[0]}: a loss that no batch moves is not "
            "computed from what the model learns (constant outputs, an output layer zeroed or "
            "detached from the graph, frozen weights)."
        )
        return [zero_grad(steps, message, key=key, value=last)]
    return []


def _term_pinned(trace: Trace) -> list[Finding]:
    """A term of the loss (a loss of the log's own, not held-out) held at a whole number other than 0,
    printed with two decimals or more, all 0, on the ``REPLAYED_RUN`` or more records a log ends
    on, while the loss it adds to moves on each of them and stays above it: the term sits at a
    bound (a clamp), so it gives no gradient while the rest trains (Cross-Modal-Re-ID's ``TLoss:
    88.0000`` batch after batch, its triplet distances clamped at 88, beside a total that moves in
    the second decimal). A running mean or a regulariser that holds at its fourth digit is no
    bound; a scale, weight or coefficient is no term."""
    total, moving = _moving_loss(trace)
    totals = lm_losses(trace)
    for key in own_losses(trace) if moving else ():
        if key in totals or any(word in key.lower() for word in _NOT_A_TERM):
            continue
        held = _held_beside_moving(trace, key, moving)
        if held is None:
            continue
        steps, value, beside, printed = held
        # a whole number printed with its decimals, all 0: a bound; a half-precision term repeats by
        # chance, and the total beside it, printed off that grid, says it is not one
        if not 0 < value <= min(beside) or not value.is_integer() or printed[1] < 2:
            continue
        message = (
            f"{key} is exactly {value:.{printed[1]}f} on {_records(len(steps), len(series(trace, key)))}, "
            f"from step {steps[0]}, while {total} moves on every one: a term of the loss held at a "
            "bound (a clamp) gives no gradient, and the rest trains without it."
        )
        return [zero_grad(steps, message, key=key, value=value, total=total)]
    return []


def _held_out_at_bound(trace: Trace) -> list[Finding]:
    """A held-out loss held at a round value, printed with two zeros or more past its own digits, on
    the ``REPLAYED_RUN`` or more records a log ends on while the training loss moves on each: the
    held-out data's outputs no longer change, the loss at the bound a collapsed model gives (a
    Keras FaceNet's ``val_loss: 0.2000`` epoch after epoch, its triplet margin: every embedding one
    point). A held-out loss that moves, or one held at a value of its own digits (a logger that
    repeats the last evaluation on each step), is not one."""
    total, moving = _moving_loss(trace)
    for key in held_out_losses(trace) if moving else ():
        held = _held_beside_moving(trace, key, moving)
        if held is None:
            continue
        steps, value, _, printed = held
        own = 0 if value.is_integer() else _decimals(value)
        if printed[1] < own + 2:
            continue
        message = (
            f"{key} is exactly {value:.{printed[1]}f} on {_records(len(steps), len(series(trace, key)))}, "
            f"from step {steps[0]}, while {total} moves on every one: a held-out loss at a round value "
            "(a margin, a clamp) is a model whose outputs no update changes (embeddings collapsed to "
            "one point, a saturated output layer)."
        )
        return [zero_grad(steps, message, key=key, value=value, total=total)]
    return []


def _networks_frozen(trace: Trace) -> list[Finding]:
    """Both networks of a GAN with every loss held at one value, printed to three significant
    digits or more, on the same ``REPLAYED_RUN`` or more records a log ends on: a GAN's losses swing
    by design, around 2 ln 2 and ln 2 at its balance too, so losses that repeat to their last digit
    are a discriminator that scores every sample alike, and no network learns (Social GAN#63:
    ``D_data_loss: 1.386`` and ``G_discriminator_loss: 0.693`` at every report)."""
    keys = network_losses(trace)
    tails = {key: series(trace, key)[-REPLAYED_RUN:] for key in keys}
    if len({network_of(key) for key in keys}) < 2 or any(
        len(tail) < REPLAYED_RUN
        or len({v for _, v in tail}) > 1
        or not tail[-1][1]
        or printed_in_text(trace, tail)[0] < 3
        for tail in tails.values()
    ):
        return []
    run = min(_held_at_end(series(trace, key), tail[-1][1]) for key, tail in tails.items())
    steps = [s for s, _ in series(trace, keys[0])[-run:]]
    shown = ", ".join(f"{key} {tail[-1][1]:g}" for key, tail in tails.items())
    message = (
        f"every loss of both networks holds one value on the last {run} records, from step {steps[0]} "
        f"({shown}): a GAN's losses swing by design, so a discriminator that scores every sample alike "
        "gives neither network a gradient (a dead discriminator: its activations saturated)."
    )
    return [zero_grad(steps, message, key=keys[0], value=tails[keys[0]][-1][1])]


def _moving_loss(trace: Trace) -> tuple[str | None, dict[int, float]]:
    """The training loss a log logs first, and its values by step."""
    total = next((key for key in lm_losses(trace) if series(trace, key)), None)
    return total, dict(series(trace, total)) if total else {}


def _held_beside_moving(
    trace: Trace, key: str, moving: dict[int, float]
) -> tuple[list[int], float, list[float], tuple[int, int]] | None:
    """The run of one exact value other than 0 that ``key`` ends on, ``REPLAYED_RUN`` records or
    more, where the loss beside it (``moving``) is logged on each and moves on each, printed off a
    half-precision grid: the run's steps, its value, the loss's values beside it, and how the log
    prints ``key``; ``None`` where there is none."""
    points = series(trace, key)
    values = [v for _, v in points]
    if not values or not values[-1] or not math.isfinite(values[-1]):
        return None
    start = run_from_end(values, lambda v, last=values[-1]: v == last)
    steps = [s for s, _ in points[start:]]
    beside = [moving[s] for s in steps if s in moving]
    if len(steps) < REPLAYED_RUN or len(beside) < len(steps) or len(set(beside)) < len(beside):
        return None
    if _printing(beside[-WINDOW:])[2]:  # a half-precision loss beside: the value repeats by chance
        return None
    return steps, values[-1], beside, printed_in_text(trace, points[-WINDOW:])


_NOT_A_TERM = ("scale", "weight", "coef")


def _at_clamp(trace: Trace) -> list[Finding]:
    """A loss at a softmax's clamp, -ln of the smallest float (caffe's 87.3365), on the two or more
    records a log ends on: the label's probability is 0 on every sample and stays so, whatever
    the updates do (SphereFace's ``softmax_loss = 87.3365`` iteration after iteration; the first
    such record is ``nonfinite``'s, or ``loss_divergence``'s where a jump led there)."""
    for key in filter(names_a_loss, logged_keys(trace)):
        points = series(trace, key)
        start = run_from_end([v for _, v in points], clamped)
        if len(points) - start < 2:
            continue
        steps = [s for s, _ in points[start:]]
        message = (
            f"{key} is {points[-1][1]:g}, -ln of the smallest float, on {_records(len(steps), len(points))}, "
            f"from step {steps[0]}: the label's probability is 0 on every sample and no update brings "
            "it back (logits blown up: a learning rate too high, an input not normalised)."
        )
        return [zero_grad(steps, message, key=key, value=points[-1][1])]
    return []


def _at_chance(trace: Trace) -> list[Finding]:
    """A language-modelling or classification loss, or one on held-out data, held at ln K, the
    cross-entropy of a uniform guess among K classes, on the ``SUSTAIN`` or more records a log
    ends on: the model's outputs no longer depend on its inputs (caffe's MobileNet at ln 1000 =
    6.90776 iteration after iteration, a four-way VCR model at ln 4 = 1.3863 epoch after epoch,
    moving in the fifth decimal). Held within :data:`CHANCE_SPREAD` of ln K, printed finely enough
    to tell K from K ± 1 and not from a half-precision number (1/64 apart near 3 in bfloat16): a
    language model's ln 50,304 is :func:`_pinned`'s to judge, being ln of any vocabulary's size.
    Two records past the run's start are enough beside an accuracy no better than a guess
    (:func:`_accuracy_below_two_in`)."""
    for key in (*lm_losses(trace), *held_out_losses(trace)):
        points = series(trace, key)
        values = [v for _, v in points]
        last = values[-1] if values else 0.0
        classes = _classes_at(last)
        if classes < 2:
            continue
        level, gap = math.log(classes), math.log1p(1 / classes)
        _, decimals, half = _printing(values[-WINDOW:], printed_in_text(trace, points[-WINDOW:]))
        half_unit = 0.5 * 10.0**-decimals
        if half_unit >= CHANCE_RESOLUTION * gap or half:
            continue  # a print too coarse, or one of a bfloat16 or float16 number: on its grid by chance
        near = min(CHANCE_SPREAD * level, CHANCE_RESOLUTION * gap) + half_unit
        start = run_from_end(values, lambda v, level=level, near=near: abs(v - level) <= near)
        accuracy = _accuracy_of_one_in(trace, points[-1][0], classes) if start < len(values) else None
        beside = f", where {accuracy} is 1/{classes} too" if accuracy else ""
        if len(values) - start < SUSTAIN and accuracy is None:
            held = len(values) - start >= 2 and _past_the_start(trace, points[start:])
            accuracy = _accuracy_below_two_in(trace, points[-1][0], classes) if held else None
            if accuracy is None:
                continue
            beside = (
                f", where {accuracy} is below 2/{classes}, no better than guessing its most frequent class"
            )
        steps = [s for s, _ in points[start:]]
        where = _records(len(steps), len(values))
        message = (
            f"{key} sits at ln {classes} = {level:.5g}, the loss of a uniform guess among {classes} "
            f"classes, on {where}, from step {steps[0]}{beside}: the model's outputs do not depend on "
            "its inputs, and no update changes that."
        )
        return [zero_grad(steps, message, key=key, value=values[-1], classes=classes)]
    return []


def _near_chance(trace: Trace) -> list[Finding]:
    """A classification loss that wanders about ln K on the ``WINDOW`` or more records a log ends
    on, every one within a quarter of the way to ln (K ± 1) and within 1 % of ln K, past the run's
    start (its step 1,000 or later, or its second epoch): a batch's loss is noisy, but one that stays
    this close to a uniform guess among K classes has learned nothing (OneFlow's MNIST quick start
    at 2.2955 … 2.3072 in its 19th epoch; DeepRobust's PGD training at 2.288 … 2.311, ln 10 =
    2.3026). The first records of a run sit there too, before it learns."""
    if is_rl(trace):
        return []
    for key in lm_losses(trace):
        points = series(trace, key)[-2 * WINDOW :]
        values = [v for _, v in points]
        if len(values) < WINDOW:
            continue
        middle = float(np.median(values))
        classes = _classes_at(middle)
        if classes < 2:
            continue
        level = math.log(classes)
        band = min(math.log1p(1 / classes) / 4, 0.01 * level)
        if any(abs(v - level) > band for v in values) or not _past_the_start(trace, points):
            continue
        steps = [s for s, _ in points]
        message = (
            f"{key} stays within {band:.2g} of ln {classes} = {level:.4f}, the loss of a uniform guess "
            f"among {classes} classes, on its last {len(values)} records, from step {steps[0]} (median "
            f"{middle:.4f}): past the run's start, the model's outputs do not depend on its inputs."
        )
        return [zero_grad(steps, message, key=key, value=middle, classes=classes)]
    return []


def _classes_at(loss: float) -> int:
    """K, where ``loss`` is nearest ln K, the loss of a uniform guess among K classes (0 for none)."""
    return round(math.exp(loss)) if 0 < loss < _CHANCE_MAX else 0


def _guessing(trace: Trace) -> list[Finding]:
    """A loss near ln K beside an accuracy near 1/K on the log's last record of both: a model
    that guesses among K classes, which the two numbers name together where neither is printed at
    exactly the uniform guess (ConvNeXt on two classes after 300 epochs, ``loss: 0.6883`` beside
    ``class_acc: 0.5352``). Not in RL, nor a best accuracy so far."""
    if is_rl(trace):
        return []
    logged = {name: dict(series(trace, name)) for name in accuracies(trace) if "max" not in name.lower()}
    for key in (*lm_losses(trace), *held_out_losses(trace)):
        points = series(trace, key)
        if not points:
            continue
        step, loss = points[-1]
        for name, scores in logged.items():
            share = _share(scores.get(step, 0.0))
            classes = round(1 / share) if share > 0 else 0
            level = math.log(classes) if classes >= 2 else 0.0
            if (
                not level
                or abs(share * classes - 1) > GUESS_SHARE
                or abs(loss - level) > GUESS_LOSS_SHARE * level
            ):
                continue
            message = (
                f"{key} is {loss:.4g} at step {step}, near ln {classes} = {level:.4g}, the loss of a uniform "
                f"guess among {classes} classes, and {name} beside it is near 1/{classes}: the model "
                "guesses, its outputs not depending on its inputs."
            )
            return [zero_grad([step], message, key=key, value=loss, classes=classes, accuracy=name)]
    return []


def _accuracy_of_one_in(trace: Trace, step: int, classes: int) -> str | None:
    """An accuracy (not RL's, not a best so far) logged at ``step`` as exactly 1/``classes``, as a
    share or a percentage: with a loss at ln ``classes`` on that record, two numbers that name the
    same uniform guess, which one record shows (flower#1398: a federated CIFAR-10 model evaluated at
    ``loss: 2.3026 - accuracy: 0.1000``)."""
    return _accuracy_at(trace, step, lambda guesses: abs(guesses * classes - 1) <= 1e-9)


def _accuracy_below_two_in(trace: Trace, step: int, classes: int) -> str | None:
    """An accuracy logged at ``step`` above 0 and below 2/``classes``: beside a loss held at ln
    ``classes`` past a run's start, a model that guesses, the most frequent class at best (a Keras
    MNIST model at ``loss: 2.3013 - accuracy: 0.1124``, the share of its most frequent digit, in
    its second epoch)."""
    return _accuracy_at(trace, step, lambda guesses: 0 < guesses * classes < 2)


def _accuracy_at(trace: Trace, step: int, test: Callable[[float], bool]) -> str | None:
    """The first accuracy (not RL's, not a best so far) logged at ``step`` whose share passes ``test``."""
    for key in accuracies(trace):
        value = dict(series(trace, key)).get(step)
        if value is not None and test(_share(value)):
            return key
    return None


def _nothing_right(trace: Trace) -> list[Finding]:
    """An accuracy of exactly 0, or an error rate of exactly 1 (100 %), on the ``REPLAYED_RUN`` or
    more records a log ends on (``SUSTAIN`` where a second such score holds with it: a character
    and a word error rate both at 100), beside a language-modelling loss that does not fall on the
    last of them (:func:`_not_falling`): a model that gets no prediction right and
    does not learn (ALBERT's pre-training after a TensorFlow upgrade, ``MLM_acc: 0.000`` for 80
    steps beside a loss at 11.17; a lip-reading model's ``Tr.CER: 1.000`` beside a loss at 3.32;
    a SpeechBrain transducer's ``valid CER: 1.00e+02, valid WER: 1.00e+02`` epoch after epoch, its
    loss at 1.08e+02). Not in RL, where an accuracy of 0 is the rewards' (``no_signal``'s)."""
    if is_rl(trace):
        return []
    loss = next((key for key in (*lm_losses(trace), *held_out_losses(trace)) if series(trace, key)), None)
    held: list[tuple[str, float, list[tuple[int, float]], int]] = []
    for key in logged_keys(trace) if loss else ():
        nothing = _nothing_right_at(key)
        points = series(trace, key) if nothing else []
        if points and points[-1][1] in nothing:
            held.append((key, points[-1][1], points, _held_at_end(points, points[-1][1])))
    two = sum(1 for *_, run in held if run >= SUSTAIN) >= 2
    least, share = (SUSTAIN, STUCK_SHARE) if two else (REPLAYED_RUN, FLAT_SHARE)
    logged = dict(series(trace, loss)) if loss else {}
    for key, nothing, points, run in held:
        steps = [s for s, _ in points[len(points) - run :]]
        beside = [logged[s] for s in steps if s in logged]
        if run < least or len(beside) < run or not _not_falling(beside[-least:], share):
            continue
        message = (
            f"{key} is {nothing:g} on {_records(run, len(points))}, from step "
            f"{steps[0]}, while {loss} {_holds(beside[-least:])}: the model gets no prediction right "
            "and no update changes that."
        )
        return [zero_grad(steps, message, key=key, loss=loss)]
    return []


def _past_the_start(trace: Trace, points: list[tuple[int, float]]) -> bool:
    """Whether ``points`` lie past a run's start: from step 1,000 on, or in its second epoch or later."""
    if points[0][0] >= 1000:
        return True
    wanted = {s for s, _ in points}
    epochs = (rec.get("epoch") for rec in trace.steps if rec.get(STEP) in wanted)
    return any(isinstance(e, int | float) and e >= 2 for e in epochs)


def _fell_to_nothing(trace: Trace) -> list[Finding]:
    """An accuracy that had reached one half or more and then sits at exactly 0 on the ``SUSTAIN``
    or more records a log ends on, or falls from one half or more to a hundredth of that on its last
    record: a model that had learned gets nothing right any more, whatever loss it logs, or none
    (CnOCR#46's MXNet Speedometer, ``accuracy=0.96`` batch after batch, then 0.4258, then 0.000000
    to the end; a BERT tagger's ``val_acc=99.718%`` in epoch 7, ``0.030%`` in epoch 8). Not in RL,
    where an accuracy of 0 is the rewards', nor beside a loss gone non-finite, any of them
    (``nonfinite``'s, which says why)."""
    if is_rl(trace):
        return []
    for key in accuracies(trace):
        points = series(trace, key)
        held = _held_at_end(points, 0.0) if points and points[-1][1] == 0 else 0
        scale = 100.0 if max((v for _, v in points), default=0.0) > 1 else 1.0  # a percentage's series
        if held < SUSTAIN:  # or one record a hundredth of one half or more before it: the collapse itself
            held = 1 if len(points) >= 2 and points[-2][1] / scale >= 0.5 > 200 * points[-1][1] / scale else 0
        earlier = [v for _, v in points[: len(points) - held]]
        if not held or not any(v / scale >= 0.5 for v in earlier):
            continue
        steps = [s for s, _ in points[len(points) - held :]]
        if _loss_nonfinite_at(trace, set(steps)):
            continue
        where = (
            f"at step {steps[0]}"
            if held == 1
            else f"and stays there on {_records(held, len(points))}, from step {steps[0]}"
        )
        message = (
            f"{key} falls from {max(earlier):.4g} to {points[-1][1]:.4g} {where}: a model that had learned "
            "gets nothing right any more (weights gone non-finite or blown up: a learning rate too high, "
            "an fp16 overflow)."
        )
        return [zero_grad(steps, message, key=key)]
    return []


def _zero_loss_beside_misses(trace: Trace) -> list[Finding]:
    """A run's loss at exactly 0 on a record whose accuracy of the same split is above 0 and below
    ``CERTAIN_SHARE``: a loss of 0 scores every sample certain and right, which an accuracy short
    of one says it is not, so the loss is not computed from the predictions and gives them no
    gradient (a Keras model whose ``val_loss: 0.0000e+00`` and then ``loss`` sit beside an accuracy
    falling from 0.51 to 0.36). Only the loss itself (``loss``, ``val_loss``), not a term of it,
    which may be 0 by design."""
    scores = accuracies(trace)
    found = []  # (record, loss, accuracy, its value): the earliest is the finding
    for loss in [key for key in logged_keys(trace) if _whole_loss(key)] if scores else []:
        held_out = HELD_OUT_KEY.match(loss.lower()) is not None
        beside = [key for key in scores if (HELD_OUT_KEY.match(key.lower()) is not None) == held_out]
        zeros = (
            [i for i, v in enumerate(column(trace, loss)) if v == 0 and type(v) is float] if beside else []
        )
        first = next(
            (
                (i, loss, key, v)
                for i in zeros
                for key in beside
                if is_number(v := trace.steps[i].get(key)) and 0 < _share(v) < CERTAIN_SHARE
            ),
            None,
        )
        found += [first] if first else []
    if not found:
        return []
    i, loss, key, v = min(found)
    step = step_of(trace.steps[i], i)
    message = (
        f"{loss} is exactly 0 at step {step} while {key} is {v:.4g} on the same record: a loss of 0 scores "
        "every sample as certain and right, which that accuracy says it is not, so the loss is not computed "
        "from the predictions and gives no gradient (a loss over an empty mask, a NaN replaced by 0, labels "
        "the loss never sees)."
    )
    return [zero_grad([step], message, key=loss)]


def _whole_loss(key: str) -> bool:
    """The loss a run trains on, by its name alone (``loss``, ``val_loss``, ``train loss``)."""
    low = key.lower().rsplit("/", 1)[-1]  # "actor/loss", a plain loss's canonical name, too
    return re.sub(r"^(?:train|training|val|valid|validation|eval|test|dev)[\s_]", "", low) == "loss"


def _loss_nonfinite_at(trace: Trace, steps: set[int]) -> bool:
    """Whether any loss the log names is non-finite at one of ``steps``."""
    scored = lm_losses(trace)
    losses = [key for key in logged_keys(trace) if names_a_loss(key) or key in scored]
    return any(
        s in steps and not math.isfinite(v) for key in losses for s, v in series(trace, key, finite=False)
    )


_ERROR_RATE = re.compile(r"(?:^|[\W_])(?:cer|wer)$")  # a character or word error rate: "Tr.CER", "val_wer"


def _nothing_right_at(key: str) -> tuple[float, ...]:
    """The values at which ``key`` scores nothing right: 0 for an accuracy, 1 or 100 for a
    character or word error rate (every word wrong, or none given: a lip-reading model's
    ``Tr.CER: 1.000``, SpeechBrain's ``valid WER: 1.00e+02``); none for any other key."""
    low = key.lower()
    if "acc" in low:
        return (0.0,)
    return (1.0, 100.0) if _ERROR_RATE.search(low) else ()


def _one_class(trace: Trace) -> list[Finding]:
    """An accuracy held at exactly 1/K (K = 2 … 10; as a share or a percentage) on the
    ``REPLAYED_RUN`` or more records a log ends on (``SUSTAIN`` where it fell there from twice that
    or more: a model that had learned, then collapsed, tch-rs#244's CIFAR-10 test accuracy 72.32 %
    to 10.00 %), printed to three decimals or more: the share
    of one class among K balanced ones, what a model that answers that class whatever its input
    scores (a link predictor's ``train acc: 0.5000 val acc: 0.5000`` epoch after epoch while its
    loss wanders). A model that learns moves its accuracy in the third decimal. Not in RL, nor a
    run's best so far, nor a preference run's reward accuracy (the share of a batch of two pairs
    ranked right is 0, 0.5 or 1). One record is enough where a top-k accuracy beside it is exactly
    k/K (FixMatch#54's CIFAR-10 model at ``top-1 acc: 10.00`` and ``top-5 acc: 50.00``: two numbers
    that name the same uniform guess). Held on ``WINDOW`` records or more, an accuracy of
    ``ONE_CLASS_SHARE`` or less need not be 1/K: classes are seldom balanced (a model that answers
    MNIST's most frequent digit whatever its input scores ``Test accuracy 0.113`` epoch after epoch)."""
    if is_rl(trace):
        return []
    for key in accuracies(trace):
        points = series(trace, key)
        value = points[-1][1] if points else 0.0
        held = _held_at_end(points, value)
        share = _share(value)
        classes = round(1 / share) if 0 < share <= 0.5 else 0
        exact = 2 <= classes <= 10 and abs(share * classes - 1) <= 1e-9
        if not exact and not (held >= WINDOW and 0 < share <= ONE_CLASS_SHARE):
            continue
        fell = held >= SUSTAIN and any(v >= 2 * value for _, v in points[: len(points) - held])
        top = _top_k_beside(trace, key, points[-1][0], classes) if exact else None
        if held < REPLAYED_RUN and not fell and top is None:
            continue
        _, decimals, _ = _printing([value], printed_in_text(trace, points[-WINDOW:]))
        if decimals < (1 if value > 1 else 3):  # 0.500 as a share, 50.0 as a percentage
            continue
        steps = [s for s, _ in points[len(points) - held :]]
        beside = f", where {top}" if top else ""
        what = f"= 1/{classes} " if exact else ""
        among = f"one class among {classes}" if exact else "one class, the most frequent at best"
        message = (
            f"{key} is exactly {value:.{decimals}f} {what}on {_records(held, len(points))}, from step "
            f"{steps[0]}{beside}: the share of {among}, what a model that gives one answer whatever its "
            "input scores; no update changes it."
        )
        return [zero_grad(steps, message, key=key, classes=classes)]
    return []


_TOP_K = re.compile(r"top[\s_-]?(\d+)", re.IGNORECASE)


def _top_k_beside(trace: Trace, key: str, step: int, classes: int) -> str | None:
    """A top-k accuracy (k of 2 or more) logged at ``step`` beside ``key``, a top-1 or plain
    accuracy, as exactly k/``classes``: what a uniform guess among ``classes`` scores, said of it."""
    named = _TOP_K.search(key)
    if named is not None and named[1] != "1":
        return None
    for other in accuracies(trace):
        k = int(found[1]) if (found := _TOP_K.search(other)) else 0
        value = dict(series(trace, other)).get(step) if 2 <= k < classes else None
        if value is not None and abs(_share(value) * classes - k) <= 1e-9:
            return f"{other} is {k}/{classes}"
    return None


def _lm_plateau(trace: Trace) -> list[Finding]:
    """A language model's training perplexity (``ppl``, or exp of a loss named ``lm loss``) held
    at ``PLATEAU_PPL`` or more on the ``PLATEAU_RECORDS`` or more records a log ends on, flat and
    not falling (:data:`~moescope.analyze.rules.thresholds.PLATEAU_SPREAD`): a model no better
    than counting words, that no update improves. A learning model falls fastest at such a
    level; a plateau there is one where nothing is learned."""
    if is_rl(trace):
        return []
    for key in logged_keys(trace):
        low = key.lower()
        perplexity = low.endswith(("ppl", "perplexity"))
        if not (perplexity or S.LM_LOSS in low or S.LM_LOSS_SPACED in low) or HELD_OUT_KEY.match(low):
            continue
        points = series(trace, key)
        losses = [math.log(v) if perplexity else v for _, v in points if not perplexity or v > 0]
        if len(losses) != len(points):
            continue
        start = _level_from(losses)
        tail = losses[start:]
        third = len(tail) // 3
        if len(tail) < PLATEAU_RECORDS or np.mean(tail[-third:]) < (1 - FLAT_SHARE / 2) * np.mean(
            tail[:third]
        ):
            continue
        steps = [s for s, _ in points[start:]]
        level = math.exp(float(np.mean(tail)))
        message = (
            f"{key} holds at a perplexity of about {level:.0f} (a loss of {math.log(level):.3g}) on "
            f"{_records(len(tail), len(losses))}, from step {steps[0]}, within {PLATEAU_SPREAD:.0%} and not "
            "falling: a language model no better than counting words, which no update improves (an output "
            "layer not trained or detached, labels not shifted against the inputs, a learning rate far off)."
        )
        return [zero_grad(steps, message, key=key, perplexity=level)]
    return []


def _level_from(losses: list[float]) -> int:
    """Where the run of losses a series ends on starts that stays within ``PLATEAU_SPREAD`` of
    its mean and at ``PLATEAU_PPL`` or above, walked back once (a running sum, low and high)."""
    start, total, low, high = len(losses), 0.0, math.inf, -math.inf
    while start > 0:
        value = losses[start - 1]
        low, high, total = min(low, value), max(high, value), total + value
        if high - low > PLATEAU_SPREAD * abs(total / (len(losses) - start + 1)) or value < _PLATEAU_LOSS:
            break
        start -= 1
    return start


_PLATEAU_LOSS = math.log(PLATEAU_PPL)


def _held_at_end(points: list[tuple[int, float]], value: float) -> int:
    """How many records a series ends on hold ``value`` exactly."""
    return len(points) - run_from_end(points, lambda point: point[1] == value)


def _share(accuracy: float) -> float:
    """An accuracy as a share: one above 1 is a percentage."""
    return accuracy / 100 if accuracy > 1 else accuracy


def _records(held: int, total: int) -> str:
    """``all N records`` or ``its last N records``, as a finding names the run it rests on."""
    if held == 1:
        return "its one record" if total == 1 else "its last record"
    return f"all {held} records" if held == total else f"its last {held} records"


def _flat(values: list[float]) -> bool:
    return max(values) - min(values) <= FLAT_SHARE * abs(float(np.mean(values)))


def _holds(values: list[float]) -> str:
    """How a loss that does not fall moves: held, or from where to where."""
    return f"holds at {values[-1]:.4g}" if _flat(values) else f"goes from {values[0]:.4g} to {values[-1]:.4g}"


def _not_falling(values: list[float], share: float = FLAT_SHARE) -> bool:
    """Flat, or its later half no lower than its earlier half's mean by ``share``: a loss
    that bounces or creeps up (PaddleOCR's recogniser at 116.6, 115.9, 117.5, 117.9 beside an
    accuracy of 0) is not falling either."""
    half = len(values) // 2
    if _flat(values):
        return True
    return half > 0 and float(np.mean(values[-half:])) >= (1 - share) * float(np.mean(values[:half]))


_CHANCE_MAX = 25.0  # nats: a guess among e^25 (7e10) classes; beyond, no print tells K from K ± 1


def _held_beside(trace: Trace, loss: str, steps: set[int], digits: int = PINNED_DIGITS) -> str | None:
    """An accuracy or another loss logged on exactly ``steps`` among the last records that holds
    one value there too (``None`` where none does), printed as finely as a pinned loss must be: a
    model whose loss and accuracy both stop to the last digit gives the same outputs (Keras's
    ``loss: 5.7257 - acc: 0.6448`` epoch after epoch), which three records show, where a loss
    alone needs five."""
    losses = lm_losses(trace)
    for key in logged_keys(trace):
        if key == loss or not ("acc" in key.lower() or key in losses):
            continue
        points = [(s, v) for s, v in series(trace, key) if s in steps]
        values = [v for _, v in points]
        if len(points) == len(steps) and _held_from(values, SUSTAIN, digits=digits) == 0:
            return key
    return None


def printed_in_text(trace: Trace, points: list[tuple[int, float]]) -> tuple[int, int]:
    """The most significant digits and decimals the log's own lines print the values of ``points``
    with, trailing zeros included (Lightning's bar prints ``train_loss=4.600``, which reads back as
    4.6); ``(0, 0)`` where the records keep no line."""
    wanted = dict(points)
    lines: dict[int, str] = {}
    for rec in reversed(trace.steps):
        if len(lines) == len(wanted):
            break
        if rec.get(STEP) in wanted and isinstance(rec.get(RAW), str):
            lines[rec[STEP]] = rec[RAW]
    digits = decimals = 0
    for step, text in lines.items():
        for number in _NUMBER_TEXT.findall(text):
            if float(number) == wanted[step]:
                mantissa = number.lstrip("+-").lower().split("e")[0]
                digits = max(digits, len(mantissa.replace(".", "").lstrip("0")))
                decimals = max(decimals, len(mantissa.partition(".")[2]))
    return digits, decimals


_NUMBER_TEXT = re.compile(rf"[-+]?{DECIMAL}")


def _held_from(
    values: list[float],
    run: int = REPLAYED_RUN,
    printed: tuple[int, int] = (0, 0),
    digits: int = PINNED_DIGITS,
) -> int | None:
    """Where the run of values a series ends on, held as :func:`_pinned` says, starts; ``None``
    where it is shorter than ``run`` records (``HALF_HELD`` for a half-precision print), is 0, or
    was reached by a jump of ``DIVERGENCE_FACTOR`` times the median before it
    (``loss_divergence``'s) or, held only within a spread, by a climb above every value before it.
    ``printed``: the digits and decimals the log's text shows; ``digits``: the fewest significant
    digits a held value must be printed with."""
    if len(values) < run or not values[-1] or not math.isfinite(values[-1]):
        return None
    shown, _, half = _printing([v for v in values[-WINDOW:] if math.isfinite(v)], printed)
    run = max(run, HALF_HELD) if half else run  # a half-precision number repeats by chance, briefly
    if shown < digits:
        return None
    spread = abs(values[-1]) * PINNED_SPREAD if shown >= FINE_DIGITS else 0.0
    start = _held_start(values, spread)
    if spread and (len(values) - start < run or values[-1] > _ceiling(values[:start], spread)):
        # not held within the spread long enough, or reached by a climb: held exactly still counts
        # (a VAE's loss at 335.553345 epoch after epoch, 0.05 above its first record)
        spread, start = 0.0, _held_start(values, 0.0)
    if len(values) - start < run or values[-1] > _ceiling(values[:start], spread):
        return None
    return start


def _held_start(values: list[float], spread: float) -> int:
    """Where the run of values a series ends on, all within ``spread`` of each other, starts."""
    start, low, high = len(values) - 1, values[-1], values[-1]
    while start > 0 and max(high, values[start - 1]) - min(low, values[start - 1]) <= spread:
        start -= 1
        low, high = min(low, values[start]), max(high, values[start])
    return start


def _ceiling(before: list[float], spread: float) -> float:
    """The highest a held value may be: held within a spread, a value above all before is a slow
    climb; held exactly, a hold after a rise, unless the rise is loss_divergence's jump."""
    finite = [v for v in before if math.isfinite(v)]
    if not finite:
        return math.inf
    return max(finite) if spread else DIVERGENCE_FACTOR * float(np.median(finite))


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


def _recycled(trace: Trace) -> list[Finding]:
    """A language-modelling loss half of whose last ``WINDOW`` records or more, the last among them,
    repeat, to the last digit, a value of the ``WINDOW`` records before each, printed with more than
    ``PINNED_DIGITS`` significant digits and taking three values or more: a few batches scored the
    same, in no fixed order, by a model that does not change (litgpt#834, LoRA under DDP: 3.1906,
    3.5551, 3.7451 again and again). A learning loss so printed repeats a recent value about once
    in fifty records, by chance."""
    for key in lm_losses(trace):
        points = series(trace, key)
        values = [v for _, v in points]
        tail = values[-WINDOW:]
        if len(tail) < WINDOW or len(set(tail)) < 3 or printed_digits(tail) <= PINNED_DIGITS:
            continue  # too few records, one or two values (a pin's or a plateau's), or a print too coarse
        start = len(values) - WINDOW
        repeats = [i for i in range(start, len(values)) if values[i] in values[max(0, i - WINDOW) : i]]
        if 2 * len(repeats) < WINDOW or repeats[-1] != len(values) - 1:
            continue  # the log ends on a value of its own: no state it ends in
        steps = [s for s, _ in points[start:]]
        message = (
            f"{key} repeats, to the last digit, a value of the {WINDOW} records before on {len(repeats)} "
            f"of its last {WINDOW} records (from step {steps[0]}): the same few batches scored the same, so "
            "the model did not change (weights never updated: adapters not trained, gradients not "
            "synchronised or not applied, a learning rate of 0)."
        )
        return [zero_grad(steps, message, key=key, repeated=len(repeats))]
    return []


def _period_of_tail(values: np.ndarray) -> int | None:
    """The shortest distance at which the last ``REPLAYED_RUN`` values appear earlier, value for
    value, where they are finite, printed finely (one printing precision for all: the most digits
    among them) and not all one value."""
    tail = values[-REPLAYED_RUN:]
    if len(values) <= REPLAYED_RUN or not np.isfinite(tail).all() or len(set(tail.tolist())) == 1:
        return None
    if printed_digits(tail.tolist()) < PINNED_DIGITS:
        return None
    earlier = sliding_window_view(values[:-1], REPLAYED_RUN)
    found = np.flatnonzero((earlier == tail).all(axis=1))
    return None if not len(found) else len(values) - REPLAYED_RUN - int(found[-1])


def printed_digits(values: list[float], printed: tuple[int, int] = (0, 0)) -> int:
    """The significant digits a series' print carries: the most among its values (one precision
    for all: ``0.9670`` reads ``0.967``) or in its text (``printed``: digits and decimals), or a
    half-precision number's 3 where every value is one rounded to the decimals printed
    (modded-llama2's ``3.2812``, ``3.3281``, ``3.3281``: a loss computed in bf16, 1/64 apart near
    3, repeats by chance however many decimals it shows)."""
    digits, _, half = _printing(values, printed)
    return min(digits, HALF_DIGITS) if half else digits


def _printing(values: list[float], printed: tuple[int, int] = (0, 0)) -> tuple[int, int, bool]:
    """The most significant digits and decimals of ``values`` as printed (the values' own or the
    text's, ``printed``), and whether every value is a half-precision number so rounded."""
    digits = max(max((significant_digits(v) for v in values), default=0), printed[0])
    decimals = max(max((_decimals(v) for v in values), default=0), printed[1])
    return digits, decimals, bool(values) and all(_half(v, decimals) for v in values)


def _decimals(value: float) -> int:
    text = repr(abs(value))
    return len(text.split(".")[1]) if "." in text and "e" not in text else 0


def _half(value: float, decimals: int) -> bool:
    """Whether ``value`` is a float16 number (11 significant bits; every bfloat16 number within
    float16's range is one) rounded to ``decimals``, where that print is finer than float16's grid
    there (a coarser print, ``0.823``, rounds every number near a float16 one: it says nothing)."""
    if value == 0 or not math.isfinite(value):
        return value == 0
    quantum = 2.0 ** (math.floor(math.log2(abs(value))) - 10)
    unit = 10.0**-decimals
    return quantum > unit and abs(round(value / quantum) * quantum - value) <= 0.5 * unit + 1e-12


def significant_digits(value: float) -> int:
    """The significant digits of ``value`` as Python prints it (``10.8259``: 6, ``2.3``: 2)."""
    return len(repr(abs(value)).split("e")[0].replace(".", "").lstrip("0"))


def zero_grad(steps: list[int], message: str, **evidence: Any) -> Finding:
    return Finding("zero_grad", steps[0], "warning", message, {**evidence, "steps": steps})
