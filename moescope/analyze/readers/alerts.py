"""The frameworks' own words: warning lines between the records, folded into the steps.

A reader keeps the records of its format and skips every other line; some of those lines are
the framework saying what went wrong, often before any metric shows it. Each line that matches
one of :data:`ALERTS` adds its count to the step it belongs to and is kept, verbatim, in that
step's ``health/alerts`` (and its raw text), for the diagnosis to quote as evidence:

- Megatron's NaN checks (``Bad grad_norm detected (grad_norm=nan)``, ``found NaN in local grad
  norm …``, ``found NaN in local forward loss …``), verl's ``WARN: rank 0 grad_norm is not
  finite: nan`` and ESPnet2's ``The grad norm is nan. Skipping updating the model.`` (the update
  skipped), PyTorch's anomaly mode (``Function 'MulBackward0'
  returned nan values in its 0th output``) and detectron2's checks (``FloatingPointError: Loss
  became infinite or NaN at iteration=2137!``, ``Predicted boxes or scores contain Inf/NaN.
  Training has diverged.``), NeMo 1.x's ``Loss is NaN or inf.`` and TensorFlow's NaN hook
  (``ERROR:tensorflow:Model diverged with loss = NaN.``) and CheckNumerics op (``LossTensor is inf
  or nan. : Tensor had NaN values``), a trainer's ``Stopping epoch because loss is NaN``, Pyro's
  ``Encountered NaN: loss`` and fastText's ``what():  Encountered NaN.``, a loop's ``NaN detected in
  gradient of embedding.weight`` and deepspeech.pytorch's ``WARNING: received
  a nan loss, setting loss value to 0`` (the loss then printed 0) → ``health/nonfinite``;
- PaddleNLP's ``optimizer not run, scale_before: 0.25, scale_after: 0.125`` → ``optim/skipped``,
  the scale it tried and the one it left; guided-diffusion's ``Found NaN, decreased lg_loss_scale to
  16.93`` → ``optim/skipped`` and the scale 2 ** 16.93;
- DeepSpeed / apex overflow lines in a log of another format (``[deepspeed] OVERFLOW! Rank 0
  Skipping step. Attempted loss scale: 65536, reducing to 32768``) → ``optim/skipped``, and the
  reduced scale as ``optim/loss_scale``; so are fairseq's (``NOTE: gradient overflow detected,
  ignoring gradient, setting loss scale to: 64.0``, older ``| WARNING: overflow detected, setting
  loss scale to: 0.25``) and its last (``FloatingPointError: Minimum loss scale reached
  (0.0001)``), which, as DeepSpeed's ``Current loss scale already at minimum - cannot decrease
  scale anymore. Exiting run.``, also sets ``optim/scaler_stopped``: the run ended there;
- a trainer's own spike guard (minFM's ``detected nan/inf/spiky gradient (norm=2.1967); skipping
  optimizer step``) → ``health/grad_spikes`` and the norm as ``actor/grad_norm`` (a norm that is
  NaN or infinite → ``health/nonfinite`` and ``optim/skipped``);
- Megatron's counters printed on a line of their own (``number of skipped iterations: 2``,
  ``number of nan iterations: 1``) → ``optim/skipped`` / ``health/nonfinite`` when above 0;
- and any other line that prints a metric as NaN (``name: nan``, ``name=nan``) in a shape the
  log's reader does not read → ``health/nonfinite``: a NaN the records would otherwise drop unseen.

A line belongs to the step its own ``step N`` / ``iteration N`` names (or the progress bar it is
glued behind counts, where the records' steps are that bar's counts), else to the record printed
after it (frameworks print a step's record once the step is done, so a warning raised during
the step comes first), else, at the end of the log, to the last record. A log without records
(only such lines) gives one step per line, indexed in order.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from moescope import schema as S
from moescope.analyze.readers._rows import Parsed, Row
from moescope.analyze.readers._text import INT, NUMBER, parse_number
from moescope.analyze.readers.keymap import canonical
from moescope.analyze.readers.megatron import (
    GLUED_BAR,
    OVERFLOW,
    SCALES,
    is_overflow,
    overflow_event,
    reduced_scale,
)
from moescope.analyze.readers.plain import STEP_IN_LINE, is_record

_COUNTER = re.compile(rf"number of (skipped|nan) iterations\s*:\s*({INT})", re.IGNORECASE)
# PaddleNLP's trainer, an update its scaler dropped:
# "optimizer not run, scale_before: 0.25, scale_after: 0.125"
_NOT_RUN = re.compile(rf"optimizer not run, scale_before:\s*({NUMBER}),\s*scale_after:\s*({NUMBER})")
# Paddle's AMP scaler (PaddleOCR, PaddleDetection), an update it dropped: "Found inf or nan, current
# scale is: 0.001953125, decrease to: 0.001953125*0.5"
_PADDLE_SCALER = re.compile(
    rf"Found inf or nan, current scale is:\s*({NUMBER}),\s*decrease to:\s*({NUMBER})\s*\*\s*({NUMBER})"
)
# OpenAI's improved- and guided-diffusion (and the trainers built on them) keep log2 of the fp16 scale:
# "Found NaN, decreased lg_loss_scale to 16.929000000013357"
_LG_SCALE = re.compile(rf"Found NaN, decreased lg_loss_scale to ({NUMBER})")
# icefall (k2) before it raises "grad_scale is too small": "Grad scale is small: 1.2924697071141057e-26"
_SMALL_SCALE = re.compile(rf"Grad scale is small:\s*({NUMBER})", re.IGNORECASE)
# fairseq's "Minimum loss scale reached (X)" as it gives up (its overflow lines are OVERFLOW's)
_SCALE_FLOOR = re.compile(rf"minimum loss scale reached \(({NUMBER})\)", re.IGNORECASE)


def _count(key: str) -> Callable[[re.Match[str], str], dict[str, Any]]:
    return lambda match, line: {key: 1}


# a trainer's own guard against gradient spikes, which skips the update: minFM's "Step 1557: detected
# nan/inf/spiky gradient (norm=2.1966569423675537); skipping optimizer step."
_SPIKE_GUARD = re.compile(rf"spiky gradient\s*\(\s*(?:grad[_ ])?norm\s*[=:]\s*({NUMBER})\s*\)", re.IGNORECASE)


def _spike_guard(match: re.Match[str], line: str) -> dict[str, Any]:
    """A finite norm is the spike the guard judged; a NaN or an infinite one is non-finite."""
    norm = parse_number(match.group(1))
    if isinstance(norm, float) and not math.isfinite(norm):
        return {S.NONFINITE: 1, S.SKIPPED: 1}
    return {S.GRAD_SPIKES: 1, S.GRAD_NORM: norm}


def _overflow(match: re.Match[str], line: str) -> dict[str, Any]:
    scales = SCALES.search(line)
    return _skipped(scales and reduced_scale(scales))


def _not_run(match: re.Match[str], line: str) -> dict[str, Any]:
    return {**_skipped(match.group(2)), S.LOSS_SCALE_TRIED: parse_number(match.group(1))}


def _paddle_scaler(match: re.Match[str], line: str) -> dict[str, Any]:
    """A skipped update, the scale it tried and the one it fell to (``X*0.5``)."""
    tried, base, factor = (parse_number(g) for g in match.groups())
    return {S.SKIPPED: 1, S.LOSS_SCALE: base * factor, S.LOSS_SCALE_TRIED: tried}


def _lg_scale(match: re.Match[str], line: str) -> dict[str, Any]:
    """A skipped update, and the scale 2 ** lg the trainer fell to."""
    return {S.SKIPPED: 1, S.LOSS_SCALE: 2.0 ** float(match.group(1))}


def _scale_floor(match: re.Match[str], line: str) -> dict[str, Any]:
    """fairseq's scaler giving up at its minimum: one more update lost, and the run stopped."""
    return {**_skipped(match.group(1)), S.SCALER_STOPPED: 1}


def _scaler_stopped(match: re.Match[str], line: str) -> dict[str, Any]:
    """DeepSpeed's scaler at its minimum raising instead of skipping one more update."""
    return {**_skipped(None), S.SCALER_STOPPED: 1}


def _skipped(scale: str | None) -> dict[str, Any]:
    """One skipped update, and the loss scale it left where the line gives it."""
    return {S.SKIPPED: 1, **({S.LOSS_SCALE: parse_number(scale)} if scale else {})}


def _counter(match: re.Match[str], line: str) -> dict[str, Any]:
    n = int(match.group(2))
    key = S.SKIPPED if match.group(1).lower() == "skipped" else S.NONFINITE
    return {key: n} if n > 0 else {}


ALERTS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str], str], dict[str, Any]]], ...] = (
    (re.compile(r"bad grad_?norm detected", re.IGNORECASE), _count(S.NONFINITE)),
    (
        re.compile(r"found (?:nan|inf) in local (?:grad norm|forward loss)", re.IGNORECASE),
        _count(S.NONFINITE),
    ),
    (re.compile(r"returned (?:nan|inf) values in its \d+\w* output", re.IGNORECASE), _count(S.NONFINITE)),
    # verl's "grad_norm is not finite: nan", ESPnet2's "The grad norm is nan. Skipping updating the model."
    (re.compile(r"grad[_ ]?norm is (?:not finite|nan|inf)", re.IGNORECASE), _count(S.NONFINITE)),
    (re.compile(r"loss became infinite or nan", re.IGNORECASE), _count(S.NONFINITE)),
    # deepspeech.pytorch's guard: "WARNING: received a nan loss, setting loss value to 0"
    (re.compile(r"received an? (?:nan|inf) loss", re.IGNORECASE), _count(S.NONFINITE)),
    (re.compile(r"\bLoss is NaN or inf\b"), _count(S.NONFINITE)),  # NeMo 1.x's actions
    # a trainer's stop (CIBHash's "Stopping epoch because loss is NaN")
    (re.compile(r"\bbecause (?:the )?loss is (?:NaN|nan|inf|Inf)\b"), _count(S.NONFINITE)),
    (re.compile(r"contain Inf/NaN\. Training has diverged"), _count(S.NONFINITE)),
    # TensorFlow's NanTensorHook (Estimator, BERT / ELECTRA / T5's TF trainers)
    (re.compile(r"Model diverged with loss = (?:NaN|Inf)"), _count(S.NONFINITE)),
    # its CheckNumerics op (the Object Detection API's trainer): "LossTensor is inf or nan. : Tensor
    # had NaN values"
    (re.compile(r"Tensor had (?:NaN|Inf) values"), _count(S.NONFINITE)),
    # Pyro's ELBO (CellBender): "UserWarning: Encountered NaN: loss"; fastText's guard, thrown as it
    # aborts: "what():  Encountered NaN."
    (re.compile(r"\bEncountered (?:NaN|Inf)(?:: loss\b|\.)"), _count(S.NONFINITE)),
    # a loop's own check: "NaN detected in gradient of embedding.weight" (PyxLSTM), "NaN detected in
    # model output"
    (
        re.compile(r"\b(?:NaN|Inf) detected in (?:the )?(?:gradient|parameter|model output|loss)\b"),
        _count(S.NONFINITE),
    ),
    # karpathy's neuraltalk and char-rnn stop on a loss far above their first: "Aboring, cost seems to
    # be exploding. Run gradcheck? Lower the learning rate?", "loss is exploding, aborting."
    (re.compile(r"(?:loss|cost) (?:seems to be|is) exploding", re.IGNORECASE), _count(S.DIVERGED)),
    (_SPIKE_GUARD, _spike_guard),
    (OVERFLOW, _overflow),
    (_NOT_RUN, _not_run),
    (_PADDLE_SCALER, _paddle_scaler),
    (_LG_SCALE, _lg_scale),
    (_SCALE_FLOOR, _scale_floor),
    (_SMALL_SCALE, lambda match, line: {S.LOSS_SCALE: parse_number(match.group(1))}),
    (re.compile(r"loss scale already at minimum", re.IGNORECASE), _scaler_stopped),
    (_COUNTER, _counter),
)
"""``(pattern, what a matching line says)``: the metrics one line adds to its step."""

# a metric printed NaN on a line of a shape the log's reader does not read as a record (EDSR's
# "[1200/10500]\t[L1: nan]" among lines of another shape): a NaN all the same
_NAMED_NAN = re.compile(r"(?<![\w.])[A-Za-z_][\w./-]*\s*[:=]\s*[-+]?nan(?!\w|\.\d)", re.IGNORECASE)


# words, one of which every pattern of ALERTS holds (lower case; "inf" apart, not as in "INFO"): a
# line without any is passed by at the cost of a few substring tests, not a search per pattern
# (the step-lines reader asks of every step line)
_ALERT_WORDS = ("nan", "finite", "bad grad", "spiky", "overflow", "scale", "iterations", "exploding")
_INF = re.compile(r"inf(?!o)")


def said(line: str) -> dict[str, Any]:
    """The metrics an alert line adds to its step; empty for any other line."""
    low = line.lower()
    if not any(word in low for word in _ALERT_WORDS) and ("inf" not in low or _INF.search(low) is None):
        return {}
    for pattern, reading in ALERTS:
        match = pattern.search(line)
        if match:
            return reading(match, line)
    return {}


def _prints_nan(line: str) -> bool:
    """Whether the line prints a metric as NaN (not darknet's statistics of a YOLO layer that saw
    no object, :func:`~moescope.analyze.readers.plain.is_record`)."""
    return "nan" in line.lower() and is_record(line) and _NAMED_NAN.search(line) is not None


def fold(parsed: Parsed, lines: list[str]) -> Parsed:
    """``parsed`` with the alert lines among its skipped ones folded into their steps."""
    alerts: list[tuple[int, str, dict[str, Any]]] = []
    warned: list[int] = []  # the framework's own warnings, and below the lines that print a NaN
    nans: list[int] = []
    pieces: set[int] = set()  # the later lines of an overflow line a terminal wrapped
    for n in parsed.skipped:
        text = lines[n - 1]
        if n in pieces:
            continue
        if is_overflow(text):  # "… Attempted loss sc" / "ale: 4096.0, reducing to 2048.0": one line
            end = overflow_event(lines, n - 1)[1]
            text = "".join(lines[n - 1 : end])
            pieces.update(range(n + 1, end + 1))
        found = said(text)
        if found or _prints_nan(text):
            (warned if found else nans).append(n)
            alerts.append((n, text.strip(), found or {S.NONFINITE: 1}))
    if not alerts:
        return parsed
    records = sorted((r for r in parsed.rows if r.line is not None), key=lambda r: r.line)
    starts = [r.line for r in records]
    table = parsed.keymap or parsed.framework
    bars = _bar_steps(alerts, records)
    scaled: set[int] = set()  # the records whose loss scale an alert gave: a later alert's replaces it
    for number, text, found in alerts:
        own = STEP_IN_LINE.search(text)
        step = int(own.group(1)) if own else bars.get(number)
        later = bisect_right(starts, number)  # the first record printed after the line
        after = records[later] if later < len(records) else records[-1] if records else None
        if step is None and after is not None:
            replace = later >= len(records) or id(after) in scaled
            if S.LOSS_SCALE in found and not any(canonical(table, k) == S.LOSS_SCALE for k in after.metrics):
                scaled.add(id(after))
            _add(after, found, text, table, later=replace)
            continue
        parsed.rows.append(Row(step, {**found, S.ALERTS: text}, text, number))
    folded = pieces.union(a[0] for a in alerts)  # once: a long log skips many lines
    parsed.skipped = [n for n in parsed.skipped if n not in folded]
    if warned:
        parsed.notes.append(
            f"{len(warned)} warning line(s) of the framework itself were read into their steps "
            f"(health/alerts; the first is line {warned[0]})"
        )
    if nans:
        parsed.notes.append(
            f"{len(nans)} line(s) of a shape not read as records print a metric as NaN: "
            f"counted as non-finite on their steps (health/alerts; the first is line {nans[0]})"
        )
    return parsed


def _bar_steps(alerts: list[tuple[int, str, dict[str, Any]]], records: list[Row]) -> dict[int, int]:
    """The count of the progress bar each alert is glued behind (``14%|█▍ | 378/2724 [13:58:09<…]
    [deepspeed] OVERFLOW! …``, one overflow a step), by line number, where the records' steps are
    that bar's counts (a record's step lies within the bars' range, as HF's records take them
    from the same bar); else none: the alerts then go on the record after them."""
    counts = {n: int(m.group(1)) for n, text, _ in alerts if (m := GLUED_BAR.match(text))}
    steps = [r.step for r in records if r.step is not None]
    if not counts or not any(min(counts.values()) <= s <= max(counts.values()) for s in steps):
        return {}
    return counts


_LEVELS = (S.LOSS_SCALE, S.LOSS_SCALE_TRIED)  # what an alert sets, not counts


def _add(row: Row, found: dict[str, Any], text: str, table: str | None, later: bool = False) -> None:
    """Fold one alert into a record: counts add to the record's own counter (under the
    framework's name when it logs one); a reduced loss scale (and the scale tried) is kept if none
    is logged, and replaces the one there when the alert came ``later`` than the record (the log's
    last lines: fairseq's scale falling to its minimum after the last record it printed) or an
    earlier alert gave it (apex's scale halved four times before one record: the last is the
    scale)."""
    for key, value in found.items():
        name = next((k for k in row.metrics if canonical(table, k) == key), key)
        if key in _LEVELS:
            row.metrics[name] = value if later else row.metrics.get(name, value)
        else:
            logged = row.metrics.get(name, 0)
            row.metrics[name] = (logged if isinstance(logged, int | float) else 0) + value
    row.metrics[S.ALERTS] = "\n".join(filter(None, [row.metrics.get(S.ALERTS), text]))
    row.raw = f"{text}\n{row.raw}"
