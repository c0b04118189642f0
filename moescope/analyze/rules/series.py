"""Reading a trace's step series, and the running statistics the rules judge them by."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import is_not, truediv
from typing import Any

import numpy as np

from moescope.analyze.findings import Finding
from moescope.analyze.rules.thresholds import NOISE_MARGIN, SUSTAIN
from moescope.schema import ACTOR_LOSS, ALERTS, GRAD_NORM, LOSS_SCALE, SKIPPED
from moescope.traces import Trace

Series = list[tuple[int, float]]


def step_of(record: dict[str, Any], index: int) -> int:
    """The record's ``step``, or its position when it logs none."""
    step = record.get("step")
    return int(step) if is_number(step) else index


def is_number(value: Any) -> bool:
    """Whether ``value`` is a logged number: an ``int`` or ``float``, not a ``bool``."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def series(trace: Trace, key: str, *, finite: bool = True) -> Series:
    """``(step, value)`` of a scalar metric; non-finite values left out unless ``finite=False``.

    Every rule reads its series from every record, so a log whose values are all plain ``float``
    / ``int`` (or absent) and whose steps are ``int`` is read a column at a time in C, and a
    metric the log lacks costs one pass (once within :func:`reading_once`)."""
    return list(shared(trace, ("series", key, finite), lambda: _series(trace, key, finite)))


def _series(trace: Trace, key: str, finite: bool) -> Series:
    values = column(trace, key)
    if values.count(None) == len(values):
        return []
    steps = column(trace, "step")
    if set(map(type, values)) <= _PLAIN and set(map(type, steps)) == {int}:
        kept = finite_rows(trace, key) if finite else _logged(values)
        return list(zip(map(steps.__getitem__, kept), map(float, map(values.__getitem__, kept)), strict=True))
    out = []
    for i, (rec, v) in enumerate(zip(trace.steps, values, strict=True)):
        if not is_number(v):
            continue
        if finite and not math.isfinite(v):
            continue
        out.append((step_of(rec, i), float(v)))
    return out


BLOCK_VALUES = 1 << 22  # values of the windows a statistic reads at a time (:func:`window_blocks`)
_PLAIN = {float, int, type(None)}  # value types read by the column path (not bool, not subclasses)


def logged_keys(trace: Trace) -> list[str]:
    """Every key the records log, in the order first logged (each key once, however many
    records log it: a rule that tests keys tests each once)."""
    return list(shared(trace, ("keys",), lambda: tuple(dict.fromkeys(chain.from_iterable(trace.steps)))))


def logged_key_set(trace: Trace) -> frozenset[str]:
    """The keys the records log, for membership tests."""
    return shared(trace, ("key set",), lambda: frozenset(logged_keys(trace)))


def run_from_end(values: Sequence[Any], flag: Callable[[Any], bool], floor: int = 0) -> int:
    """Where the run of ``values`` a series ends on, each ``flag``ged, starts (``len(values)``
    where the last is not; never before ``floor``): walked back from the end, so a long series
    costs its run, not its length."""
    start = len(values)
    while start > floor and flag(values[start - 1]):
        start -= 1
    return start


def accuracies(trace: Trace) -> list[str]:
    """The accuracies logged, but for a run's best so far and a preference run's reward accuracy."""
    return [
        key
        for key in logged_keys(trace)
        if "acc" in (low := key.lower()) and "best" not in low and "reward" not in low
    ]


def scaler_skipped(record: dict[str, Any]) -> bool:
    """A step dynamic loss scaling skipped: one the log says it skipped, or, where it says nothing
    of it, one whose gradient norm is not finite beside a finite loss and a loss scale other than 1
    (PyTorch's GradScaler skips such a step and lowers the scale: VideoMAE's ``loss: 5.9916
    loss_scale: 32768.0000 grad_norm: inf`` at its first step)."""
    scale = record.get(LOSS_SCALE)
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale != 1.0):
        return False
    if SKIPPED in record:
        return bool(record[SKIPPED])
    norm, loss = record.get(GRAD_NORM), record.get(ACTOR_LOSS)
    finite_loss = isinstance(loss, int | float) and math.isfinite(loss)
    return isinstance(norm, float) and not math.isfinite(norm) and finite_loss


def guarded(trace: Trace, key: str) -> tuple[list[int], str]:
    """The steps where a trainer's own guard fired (``key`` above 0: ``health/grad_spikes``,
    ``health/diverged``), and the first warning line such a step keeps (``""`` where none)."""
    steps = [s for s, v in series(trace, key) if v > 0]
    said = next((rec[ALERTS] for rec in trace.steps if rec.get(key) and rec.get(ALERTS)), "") if steps else ""
    return steps, said.splitlines()[0].strip() if said else ""


def first_logged(trace: Trace, keys: Sequence[str]) -> str | None:
    """The first of ``keys`` the trace logs at all."""
    logged = logged_key_set(trace)
    return next((k for k in keys if k in logged), None)


def column(trace: Trace, key: str) -> list[Any]:
    """Every record's value of ``key`` (``None`` where a record lacks it), in record order; one
    list shared by the rules within :func:`reading_once`, which must not change it."""
    return shared(trace, ("column", key), lambda: _column(trace, key))


def _column(trace: Trace, key: str) -> list[Any]:
    if _READING.get() is not None and key not in logged_key_set(trace):  # the keys known: no pass
        return [None] * len(trace.steps)
    return [rec.get(key) for rec in trace.steps]


def finite_rows(trace: Trace, key: str) -> list[int]:
    """Where in the records ``key`` is logged as a finite number (shared as :func:`column` is);
    a column of plain ``float`` / ``int`` / ``None`` is tested in C."""
    return shared(trace, ("finite", key), lambda: _finite_rows(column(trace, key)))


def _finite_rows(values: list[Any]) -> list[int]:
    if set(map(type, values)) <= _PLAIN:
        kept = _logged(values)
        return list(compress(kept, map(math.isfinite, map(values.__getitem__, kept))))
    return [i for i, value in enumerate(values) if is_number(value) and math.isfinite(value)]


def _logged(values: list[Any]) -> list[int]:
    """Where ``values`` is not ``None``."""
    return list(compress(range(len(values)), map(is_not, values, repeat(None))))


def steps_of(trace: Trace) -> list[int]:
    """:func:`step_of` of every record, in record order (shared as :func:`column` is)."""
    return shared(trace, ("steps",), lambda: _steps_of(trace))


def _steps_of(trace: Trace) -> list[int]:
    steps = column(trace, "step")
    if set(map(type, steps)) == {int}:  # every record logs an int step (the readers' traces): as is
        return list(steps)
    return [step_of(rec, i) for i, rec in enumerate(trace.steps)]


_READING: ContextVar[dict[tuple[int, tuple[Any, ...]], tuple[Trace, Any]] | None] = ContextVar(
    "moescope_reading_once", default=None
)


@contextmanager
def reading_once() -> Iterator[None]:
    """Within it, what the rules derive from a trace (its keys, a column, a series) is derived
    once and shared: a diagnosis runs fifteen checks over the same records, which would each walk
    a million-step log again for the same column. Outside it nothing is kept, since a caller may
    change a trace's records between two checks."""
    token = _READING.set({})
    try:
        yield
    finally:
        _READING.reset(token)


def shared(trace: Trace, what: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
    """``compute()``, kept for ``trace`` within :func:`reading_once` (the trace is held beside
    its entries, so that its ``id`` cannot be reused by another while they live)."""
    memo = _READING.get()
    if memo is None:
        return compute()
    entry = memo.get((id(trace), what))
    if entry is None:
        entry = memo[(id(trace), what)] = (trace, compute())
    return entry[1]


def running(values: Sequence[float], width: int, fn: Callable[[Sequence[float]], float]) -> list[float]:
    """``fn`` over the trailing window of ``width`` values at every position.

    The mean most rules take (:func:`statistics.fmean`) is each window's ``fsum`` over its length,
    as ``fmean`` computes it, mapped in C instead of a call per position; over a window wider than
    :data:`SUSTAIN` (a noisy series', :func:`noise_window`), numpy's mean of each window. A running
    :func:`statistics.median` is :func:`running_median`'s."""
    if fn not in (statistics.fmean, statistics.median) or width < 1:
        return [fn(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]
    head = [values[: i + 1] for i in range(min(width - 1, len(values)))]
    if fn is statistics.median:
        return [*map(statistics.median, head), *running_median(values, width)]
    means = [*map(truediv, map(math.fsum, head), map(len, head))]
    if len(values) < width:
        return means
    if width > SUSTAIN:
        return [*means, *windows(values, width).mean(axis=1).tolist()]
    shifted = (values[k : len(values) - width + 1 + k] for k in range(width))
    return [*means, *map(truediv, map(math.fsum, zip(*shifted, strict=True)), repeat(width))]


def windows(values: Sequence[float] | np.ndarray, width: int) -> np.ndarray:
    """``(n - width + 1, width)``: every full window of ``width`` values, a view, not a copy."""
    return np.lib.stride_tricks.sliding_window_view(np.asarray(values, dtype=np.float64), width)


def window_blocks(full: np.ndarray) -> Iterator[np.ndarray]:
    """:func:`windows`' rows a block at a time, each block of about :data:`BLOCK_VALUES` values:
    what a statistic copies of them stays small however long the series."""
    rows = max(1, BLOCK_VALUES // max(1, full.shape[1]))
    for lo in range(0, len(full), rows):
        yield full[lo : lo + rows]


def running_median(values: Sequence[float], width: int) -> list[float]:
    """:func:`statistics.median` of every full window of ``width`` values: by numpy
    (:func:`row_medians`) where every value is a finite ``float``,
    else a window at a time (NaN has no place in an order, and numpy's median of one is NaN)."""
    if len(values) < width:
        return []
    array = np.asarray(values, dtype=np.float64)
    if set(map(type, values)) != {float} or not np.isfinite(array).all():
        return [statistics.median(values[i - width + 1 : i + 1]) for i in range(width - 1, len(values))]
    return [m for block in window_blocks(windows(array, width)) for m in row_medians(block).tolist()]


def row_medians(rows: np.ndarray) -> np.ndarray:
    """:func:`statistics.median` of each row, with its arithmetic: the middle value, or the two
    middle ones' sum halved (numpy's sort of short rows is faster than its partition)."""
    ordered = np.sort(rows, axis=1)
    half = rows.shape[1] // 2
    return ordered[:, half] if rows.shape[1] % 2 else (ordered[:, half - 1] + ordered[:, half]) / 2


def above_ceiling(kind: str, key: str, points: Series, ceiling: float, what: str, why: str) -> Finding | None:
    """An error at the first value at or above ``ceiling``, a level no healthy run logs: judged on
    one record, without history, as a pasted excerpt or a snapshot of one record has none, and
    decisive there (``what``: the metric in words, ``why``: what such a value means)."""
    hit = next(((s, v) for s, v in points if v >= ceiling), None)
    if hit is None:
        return None
    step, value = hit
    return Finding(
        kind,
        step,
        "error",
        f"{what} {value:.3g} at step {step}: above {ceiling:.3g}, which no healthy run logs, whatever "
        f"came before ({why}).",
        {"key": key, "value": value, "ceiling": ceiling, "steps": [step]},
    )


def baseline(values: Sequence[float]) -> float:
    """Median of the early run (the first tenth, at least 3 values)."""
    n = max(3, len(values) // 10)
    return statistics.median(values[:n])


def backdate(values: Sequence[float], start: int, crossed: Callable[[float], bool]) -> int:
    """Move an onset found on a running statistic back to the first raw value that crossed."""
    first = start
    for i in range(start, max(-1, start - SUSTAIN), -1):
        if crossed(values[i]):
            first = i
        else:
            break
    return first


def sustained(flags: Sequence[bool], length: int = SUSTAIN) -> int | None:
    """Index where ``length`` consecutive True flags start, else None."""
    run = 0
    for i, flag in enumerate(flags):
        run = run + 1 if flag else 0
        if run == length:
            return i - length + 1
    return None


def throughout(flags: Sequence[bool], length: int = SUSTAIN) -> int | None:
    """Where ``length`` consecutive True flags start; in an excerpt shorter than that whose
    every flag is True, 0 (a few pasted records that all say it are decisive). Else None."""
    start = sustained(flags, length)
    return 0 if start is None and 0 < len(flags) < length and all(flags) else start


def held_to_end(run: int, total: int, length: int = SUSTAIN, least: int = 1) -> int | None:
    """Where the ``run`` of flagged records that ends a series of ``total`` starts, when it holds
    ``length`` records or, in a paste shorter than twice that, ``least`` (the records a short
    paste ends on say it); else None. A state the log ends in, not one it passed through: the
    caller counts the run from the end back, so a long log costs its run, not its length."""
    enough = run >= length or (total < 2 * length and run >= least)
    return total - run if run and enough else None


def episodes(steps: Sequence[int], gap: int = 2) -> list[list[int]]:
    """Runs of steps no more than ``gap`` apart."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s - runs[-1][-1] <= gap:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


@dataclass(frozen=True)
class Shift:
    """A sustained move of a running statistic away from the early-run level."""

    step: int
    base: float
    running: list[float]

    def finding(self, type: str, severity: str, message: str, **data: Any) -> Finding:
        """The finding this shift raises, dated at its onset; ``data`` is its evidence."""
        return Finding(type, self.step, severity, message, data)


def noise_window(values: Sequence[float] | np.ndarray, gap: float) -> int:
    """Values a running mean takes so that the series' own noise, at the extremes a series of its
    length reaches by chance, moves it by less than ``gap``: :data:`SUSTAIN` for a series whose
    steps agree (most logged means), more for one whose step-to-step noise is of the size of the
    shift judged. The noise is read from second differences (their median), which neither a
    trend nor a shift itself moves much."""
    n = len(values)
    if n < 3 or not gap > 0:
        return SUSTAIN
    second = np.abs(np.diff(np.asarray(values, dtype=np.float64), 2))
    sigma = float(np.median(second)) / (0.6745 * math.sqrt(6))
    root = math.sqrt(2 * math.log(n))
    largest = root - (math.log(math.log(n)) + math.log(4 * math.pi)) / (2 * root)  # of n normal draws
    width = math.ceil((2 * max(largest, 0.0) * NOISE_MARGIN * sigma / gap) ** 2)
    return max(SUSTAIN, min(width, n))  # at most the series: a mean of all of it


def shift(
    points: Series,
    crossed: Callable[[float, float], bool],
    *,
    stat: Callable[[Sequence[float]], float] = statistics.fmean,
    min_points: int = SUSTAIN + 3,
    positive_base: bool = False,
    gap: Callable[[float], float] | None = None,
) -> Shift | None:
    """Where ``crossed(running value, baseline)`` first holds for ``SUSTAIN`` steps, dated back to
    the first raw value that crossed; None when it never does. With ``gap`` (the baseline → how
    far the running value must move to cross), the running mean spans :func:`noise_window` steps;
    of a series of two values (a win or a loss an episode) only a mean over that many is judged:
    Haiku's IMPALA on Catch, three wins, then a loss, a win, a loss, is no collapse at its sixth
    episode."""
    values = [v for _, v in points]
    if len(values) < min_points:
        return None
    base = baseline(values)
    if positive_base and base <= 0:
        return None
    width = SUSTAIN if gap is None else noise_window(values, gap(base))
    trail = running(values, width, stat)
    judged = width - 1 if width > SUSTAIN and _two_valued(values) else 0  # a win or a loss: whole windows
    start = sustained([i >= judged and crossed(r, base) for i, r in enumerate(trail)])
    if start is None:
        return None
    return Shift(points[backdate(values, start, lambda v: crossed(v, base))][0], base, trail)


def _two_valued(values: Sequence[float]) -> bool:
    """Whether ``values`` take two values at most (read until a third shows: a noisy series'
    first few)."""
    seen: set[float] = set()
    for value in values:
        seen.add(value)
        if len(seen) > 2:
            return False
    return True


def fall_from_peak(points: Series, ratio: float, *, min_points: int = SUSTAIN + 3) -> Shift | None:
    """Where the running mean falls below ``ratio`` of the highest level the run held before, for
    ``SUSTAIN`` steps, dated back to the first raw value that fell; the shift's ``base`` is that
    peak. A run that rose far above its start and then lost it all is judged against what it
    reached, not the start it passed (a fall back to the early level is a collapse all the same).

    A level is held when ``SUSTAIN`` values in a row reach it (the least of them), so that a noisy
    reward's lucky step sets no peak; in a series whose steps are as noisy as the fall, as many
    values as its running mean spans (:func:`noise_window`). None when the early level is not positive."""
    values = [v for _, v in points]
    if len(values) < min_points or baseline(values) <= 0:
        return None
    array = np.asarray(values, dtype=np.float64)  # read once for the noise and the held levels
    width = noise_window(array, (1 - ratio) * baseline(values))
    peaks = [-math.inf] * (width - 1) + np.maximum.accumulate(windows(array, width).min(axis=1)).tolist()
    trail = running(values, width, statistics.fmean)
    start = sustained([r < ratio * peak for r, peak in zip(trail, peaks, strict=True)])
    if start is None:
        return None
    peak = peaks[start]
    return Shift(points[backdate(values, start, lambda v: v < ratio * peak)][0], peak, trail)
