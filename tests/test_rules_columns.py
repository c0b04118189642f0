"""The rules' shortcuts for long traces (a column read in C, a sliding window kept in order, the
records that may hold a non-finite value found a key at a time) give what reading every record
one by one gives, on traces of every value type a log can hold."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from moescope import schema as S
from moescope.analyze.rules import gradients, nonfinite
from moescope.analyze.rules import series as series_module
from moescope.analyze.rules.series import first_logged, reading_once, running, series, step_of
from moescope.analyze.rules.thresholds import (
    GRAD_SPIKE_EXTREME,
    GRAD_SPIKE_FACTOR,
    GRAD_SPIKE_Z,
    SUSTAIN,
    WINDOW,
)
from moescope.traces import Trace

VALUES = (0.5, 2, 0.0, -1.5, math.nan, math.inf, -math.inf, None, True, "0.3")
VALUES += (np.float64(0.7), np.float64("nan"))  # float subclasses: read value by value


def _outcome(fn, *args, **kwargs) -> object:
    """What a call returns, or the type of what it raises."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        return type(err)


def _record_by_record(trace: Trace, key: str, finite: bool) -> list[tuple[int, float]]:
    out = []
    for i, rec in enumerate(trace.steps):
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or (finite and not math.isfinite(v)):
            continue
        out.append((step_of(rec, i), float(v)))
    return out


def _trace(rng: random.Random, n: int, values: tuple, steps: tuple = (None,)) -> Trace:
    records = []
    for i in range(n):
        rec: dict = {"step": rng.choice(steps) if rng.random() < 0.1 else i}
        for key in ("a", "b"):
            if rng.random() < 0.8:
                rec[key] = rng.choice(values)
        records.append(rec)
    return Trace(header={}, steps=records)


@pytest.mark.parametrize("seed", range(30))
def test_series_reads_what_a_record_by_record_reading_reads(seed: int) -> None:
    rng = random.Random(seed)
    values = tuple(rng.sample(VALUES, rng.randint(1, 4))) + (10**400,) * (seed % 10 == 0)
    trace = _trace(rng, rng.randint(0, 40), values, (None, 3.0, True, "7", -1, 5))
    for key in ("a", "b", "c"):
        for finite in (True, False):
            want = _outcome(_record_by_record, trace, key, finite)
            assert repr(_outcome(series, trace, key, finite=finite)) == repr(want)
            with reading_once():  # what the checks of one diagnosis share: read once, the same
                shared = [_outcome(series, trace, key, finite=finite) for _ in range(2)]
            assert [repr(got) for got in shared] == [repr(want)] * 2


def test_what_one_diagnosis_shares_is_kept_within_it_and_no_longer() -> None:
    trace = Trace(header={}, steps=[{"step": 0, "a": 1.0}, {"step": 1, "a": 2.0}])
    with reading_once():
        first = series(trace, "a")
        first.append((9, 9.0))  # a rule's own copy: changing it changes nothing shared
        trace.steps.append({"step": 2, "a": 3.0, "b": 1.0})
        assert series(trace, "a") == [(0, 1.0), (1, 2.0)]
        assert first_logged(trace, ("b", "a")) == "a"
    assert series(trace, "a") == [(0, 1.0), (1, 2.0), (2, 3.0)]  # outside, every call reads the records
    assert first_logged(trace, ("b", "a")) == "b"


def _spikes_one_window_at_a_time(points: list[tuple[int, float]]) -> list[tuple[int, float, float]]:
    spikes = []
    for i in range(2, len(points)):
        prev = [math.log(v) for _, v in points[max(0, i - WINDOW) : i]]
        med = statistics.median(prev)
        mad = statistics.median(abs(x - med) for x in prev) * 1.4826
        rise = math.log(points[i][1]) - med
        robust = rise > math.log(GRAD_SPIKE_FACTOR) and rise > GRAD_SPIKE_Z * max(mad, 0.05)
        robust = robust and len(prev) >= 3
        above_all = rise > max(prev) - med + math.log(GRAD_SPIKE_FACTOR)
        extreme = above_all and (len(prev) >= 3 or rise > math.log(GRAD_SPIKE_EXTREME))
        if robust or extreme:
            spikes.append((points[i][0], points[i][1], math.exp(med)))
    return spikes


@pytest.mark.parametrize("seed", range(30))
def test_the_sliding_median_finds_the_spikes_each_window_finds(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    levels = [0.0, 1.0, 1.0, 2.0, 0.5, math.nan] + [rng.uniform(0.1, 3) for _ in range(4)]
    jumps = [rng.choice([1, 1, 1, 50, 1000]) if rng.random() < 0.1 else 1 for _ in range(80)]
    norms = [rng.choice(levels) * jump for jump in jumps]
    trace = Trace(header={}, steps=[{"step": i, S.GRAD_NORM: v} for i, v in enumerate(norms)])
    monkeypatch.setattr(series_module, "BLOCK_VALUES", 1 + 7 * seed)  # windows read a few at a time
    spikes = _spikes_one_window_at_a_time([(s, v) for s, v in series(trace, S.GRAD_NORM) if v > 0])
    want = [([s for s, _, _ in spikes], spikes[0][1], spikes[0][2])] if spikes else []
    found = gradients.check_grad_spike(trace)  # every norm below the ceiling judged without history
    assert [(f.evidence["steps"], f.evidence["value"], f.evidence["baseline"]) for f in found] == want


@pytest.mark.parametrize("seed", range(30))
def test_the_nonfinite_steps_are_those_a_record_by_record_reading_finds(seed: int) -> None:
    rng = random.Random(seed)
    values = (*VALUES, 10**400, [1.0], "nan")
    trace = _trace(rng, rng.randint(1, 40), values)
    for rec in trace.steps:
        rec.update(rng.choice([{}, {S.NONFINITE: 1}, {S.NONFINITE: 0}, {S.SKIPPED: 1, S.LOSS_SCALE: 1024.0}]))
        if rng.random() < 0.3:
            rec[S.GRAD_NORM] = rng.choice(values)
    numeric = nonfinite._numeric_keys(trace)
    every = [
        i
        for i, rec in enumerate(trace.steps)
        if rec.get(S.NONFINITE) or any(k in numeric and nonfinite._bad(v) for k, v in rec.items())
    ]
    assert nonfinite._suspects(trace, numeric) == every


@pytest.mark.parametrize("seed", range(20))
def test_the_running_mean_is_the_mean_of_each_window(seed: int) -> None:
    rng = random.Random(seed)
    values = [
        rng.choice([rng.uniform(-5, 5), 1e300, -1e-300, 3, math.nan]) for _ in range(rng.randint(0, 12))
    ]
    values += [math.inf, -math.inf] * (seed % 5 == 0)  # fsum refuses inf - inf, as fmean does
    for width in range(1, SUSTAIN + 1):
        want = _outcome(
            lambda w=width: [statistics.fmean(values[max(0, i - w + 1) : i + 1]) for i in range(len(values))]
        )
        assert repr(_outcome(running, values, width, statistics.fmean)) == repr(want)
    # a wider window (a noisy series', noise_window) is numpy's mean: fmean's to rounding, on the
    # finite values the rules read
    finite = [v for v in values if math.isfinite(v)]
    for width in range(SUSTAIN + 1, SUSTAIN + 4):
        want = [statistics.fmean(finite[max(0, i - width + 1) : i + 1]) for i in range(len(finite))]
        got = running(finite, width, statistics.fmean)
        assert len(got) == len(want)
        assert all(math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-285) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("seed", range(20))
def test_the_running_median_is_the_median_of_each_window(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series_module, "BLOCK_VALUES", 1 + seed)  # windows read a few at a time
    rng = random.Random(seed)
    pool = [rng.uniform(-5, 5), 1e300, -1e-300, 0.25, 0.25, math.nan, math.inf, 3]
    finite = seed % 2 == 0  # what the rules read; else a NaN, an inf or an int now and then
    values = [rng.choice(pool[:5] if finite else pool) for _ in range(rng.randint(0, 40))]
    for width in range(1, 12):
        want = [statistics.median(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]
        assert repr(running(values, width, statistics.median)) == repr(want)
