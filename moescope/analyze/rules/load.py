"""``load_collapse`` (per layer): tokens concentrating on few experts, read from the per-layer
expert load, the load-balancing loss (its rise, or in Megatron's normalisation its level against
the balanced value, which a few pasted lines settle), or (a log with only the scalar) the load CV."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import replace

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.readers.hints import RECOMPUTE
from moescope.analyze.rules.series import (
    column,
    first_logged,
    logged_key_set,
    logged_keys,
    series,
    shift,
    steps_of,
    throughout,
)
from moescope.analyze.rules.thresholds import (
    LBL_IMBALANCED,
    LOAD_SHARE_FACTOR,
    RECOMPUTE_DOUBLE_MAX,
    SUSTAIN,
    WINDOW,
)
from moescope.traces import Trace

UNSCALED_LBL = ("megatron", "nemo-rl")
"""Frameworks that log Megatron's load-balancing loss divided by its coefficient: 1 when balanced.
(transformers' is top-k when balanced, which a log does not say, so its level is not judged.)"""
MEGATRON_LBL_KEYS = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss")
"""Megatron's names, judged under any framework that logs them as is (ms-swift's Megatron backend)."""
PER_LAYER_CV = re.compile(r"(?:train/)?moe/layer_(\d+)/cv")
"""NeMo Automodel's per-layer load CV (``moe/layer_{i}/cv``), read under its own name."""
DEAD_SHARE = 0.25  # a quarter of the experts idle: the level the per-layer expert-load rule calls dead
PER_LAYER_LBL = re.compile(r"(?:train/)?moe/(?:seq_|global_)?load_balancing_loss_layer_(\d+)")
"""Megatron's per-layer load-balancing loss (``--moe-per-layer-logging``), read under its own name."""


def check_load_collapse(trace: Trace) -> list[Finding]:
    steps, loads = _load_windows(trace)
    out: list[Finding] = []
    width = max(SUSTAIN, min(WINDOW, len(loads) // 4))
    if len(loads) >= 2 * width:
        for layer in range(len(loads[0])):
            finding = _layer_collapse(layer, steps, [load[layer] for load in loads], width)
            if finding is not None:
                out.append(finding)
    elif loads:  # an excerpt too short for a trend: what every record shows
        out += _concentrated(trace, steps, loads)
    out += _aux_loss_rise(trace) or _aux_loss_level(trace)
    if not loads:  # a log with only the scalars: the load CV (per layer too), dead experts, MaxVio
        out += _load_cv_rise(trace, S.LOAD_CV)
        for key, layer in _per_layer(trace, PER_LAYER_CV):
            out += [replace(f, layer=layer) for f in _load_cv_rise(trace, key)]
        out += _held(trace, S.DEAD_EXPERT_FRAC, lambda v: v >= DEAD_SHARE, "of the experts receive no token")
        out += _held(
            trace, S.USED_EXPERT_FRAC, lambda v: v <= 1 - DEAD_SHARE, "of the experts receive tokens"
        )
        out += _held(
            trace,
            S.MAX_VIOLATION,
            lambda v: v >= LOAD_SHARE_FACTOR - 1,
            "MaxVio: the busiest expert's load over the mean, minus 1",
        )
    return out


def _per_layer(trace: Trace, pattern: re.Pattern[str]) -> list[tuple[str, int]]:
    """``(key, layer)`` of every logged key matching ``pattern`` (its group 1 the layer)."""
    found = {m.group(0): int(m.group(1)) for k in logged_keys(trace) if (m := pattern.fullmatch(k))}
    return sorted(found.items(), key=lambda kv: kv[1])


def _held(trace: Trace, key: str, bad: Callable[[float], bool], what: str) -> list[Finding]:
    """A load summary at a collapsed level on ``SUSTAIN`` records in a row (every record of a
    shorter excerpt)."""
    points = series(trace, key)
    start = throughout([bad(v) for _, v in points])
    if start is None:
        return []
    step, value = points[start]
    message = f"Expert load collapses from step {step}: {key} is {value:.3g} ({what})."
    return [Finding("load_collapse", step, "warning", message, {"key": key, "value": value})]


def _load_windows(trace: Trace) -> tuple[list[int], list[list[list[float]]]]:
    """Steps that log the per-layer expert load, and those loads."""
    steps: list[int] = []
    loads: list[list[list[float]]] = []
    if S.EXPERT_LOAD not in logged_key_set(trace):
        return steps, loads
    for step, load in zip(steps_of(trace), column(trace, S.EXPERT_LOAD), strict=True):
        if isinstance(load, list) and load and all(isinstance(row, list) for row in load):
            steps.append(step)
            loads.append(load)
    return steps, loads


def _mean_rows(rows: Iterable[list[float]]) -> list[float]:
    rows = list(rows)
    return [statistics.fmean(col) for col in zip(*rows, strict=True)]


def _layer_collapse(layer: int, steps: list[int], shares: list[list[float]], width: int) -> Finding | None:
    experts = len(shares[0])
    early = _mean_rows(shares[:width])
    early_max = max(early)
    used_early = [v >= 0.5 / experts for v in early]  # experts a task mix never routes to do not count

    def signs(load: list[float]) -> tuple[float, int, bool, bool]:
        """The busiest share, the experts gone dead, and whether either shows a collapse."""
        top = max(load)
        dead = sum(1 for v, used in zip(load, used_early, strict=True) if used and v == 0)
        return top, dead, top > LOAD_SHARE_FACTOR / experts and top > 2 * early_max, dead >= experts / 4

    def shows_collapse(load: list[float]) -> bool:
        _, _, hot, starving = signs(load)
        return hot or starving

    for end in range(width, len(shares) + 1):
        window = _mean_rows(shares[end - width : end])
        top, dead, hot, starving = signs(window)
        if hot or starving:
            # the onset is the window's first step that shows the collapse on its own (a window
            # held high by its last steps does not date the collapse to its first)
            first = range(end - width, end)
            step = next((steps[i] for i in first if shows_collapse(shares[i])), steps[end - width])
            what = (
                f"expert {window.index(top)} takes {top:.1%} of the slots (uniform {1 / experts:.1%})"
                if hot
                else f"{dead} of {experts} experts that were busy early on receive no tokens"
            )
            return Finding(
                "load_collapse",
                step,
                "warning",
                f"Expert load collapses in layer {layer} from step {step}: {what}.",
                {"max_share": top, "dead_experts": dead, "early_max_share": early_max},
                layer=layer,
            )
    return None


def _concentrated(trace: Trace, steps: list[int], loads: list[list[list[float]]]) -> list[Finding]:
    """Layers where, on every record of a short excerpt, one expert takes at least half the
    routing slots and ``LOAD_SHARE_FACTOR`` times its uniform share: a collapse no trend is needed
    for (a user's printed top-k ids with every token on one expert)."""
    names = next((r.get(S.EXPERT_LOAD_LAYERS) for r in trace.steps if r.get(S.EXPERT_LOAD_LAYERS)), None)
    out = []
    for row in range(len(loads[0])):
        shares = [load[row] for load in loads if row < len(load) and any(load[row])]
        if not shares or not all(max(s) >= 0.5 and max(s) > LOAD_SHARE_FACTOR / len(s) for s in shares):
            continue
        layer = names[row] if names and row < len(names) else row
        top = min(max(s) for s in shares)
        expert = shares[0].index(max(shares[0]))
        out.append(
            Finding(
                "load_collapse",
                steps[0],
                "warning",
                f"Expert load is collapsed in layer {layer}: expert {expert} takes at least {top:.0%} of "
                f"the routing slots on every one of the {len(shares)} record(s) "
                f"(uniform {1 / len(shares[0]):.1%}).",
                {"max_share": top, "expert": expert, "records": len(shares)},
                layer=layer,
            )
        )
    return out


def _load_cv_rise(trace: Trace, key: str) -> list[Finding]:
    rise = shift(series(trace, key), lambda v, base: v > max(2 * base, 1.0), min_points=2 * SUSTAIN + 3)
    if rise is None:
        return []
    peak = max(rise.running)
    message = (
        f"The expert-load CV {key} rises from {rise.base:.3g} to {peak:.3g} at step {rise.step}: tokens "
        "concentrate on fewer experts."
    )
    return [rise.finding("load_collapse", "warning", message, key=key, baseline=rise.base, peak=peak)]


def _aux_loss_rise(trace: Trace) -> list[Finding]:
    key = first_logged(trace, (S.AUX_LOSS,))
    rise = (
        None
        if key is None
        else shift(
            series(trace, key),
            lambda v, base: v > 2 * base,
            stat=statistics.median,
            min_points=2 * SUSTAIN + 3,
            positive_base=True,
        )
    )
    if rise is None:
        return []
    message = (
        f"The load-balancing loss {key} doubles from its early level {rise.base:.3g} at step "
        f"{rise.step}: routing is concentrating on fewer experts."
    )
    return [rise.finding("load_collapse", "warning", message, key=key, baseline=rise.base)]


def _aux_loss_level(trace: Trace) -> list[Finding]:
    """Megatron's load-balancing loss at ``LBL_IMBALANCED`` times its balanced value or more, on
    ``SUSTAIN`` steps in a row or on every record of a shorter excerpt: the model's, then each
    layer's (``--moe-per-layer-logging``: ``moe/load_balancing_loss_layer_<i>``)."""
    unscaled = trace.header.get("framework") in UNSCALED_LBL
    key = S.AUX_LOSS if unscaled else first_logged(trace, MEGATRON_LBL_KEYS)
    whole = _lbl_level(trace, key, None) if key else None
    layers = sorted(_per_layer(trace, PER_LAYER_LBL))
    found = [f for k, layer in layers if (f := _lbl_level(trace, k, layer)) is not None]
    return ([whole] if whole else []) + found


def _lbl_level(trace: Trace, key: str, layer: int | None) -> Finding | None:
    doubled = bool(trace.header.get(RECOMPUTE))  # recorded twice under recompute (Megatron-LM#1330)
    points = [(s, v / 2 if doubled else v) for s, v in series(trace, key)]
    start = throughout([v >= LBL_IMBALANCED for _, v in points])
    if start is None:
        return None
    step, value = points[start]
    where = f" in layer {layer}" if layer is not None else ""
    logged = f" (logged {2 * value:.3g}, counted twice under activation recompute)" if doubled else ""
    maybe_doubled = (
        " A value near 2 is also what a balanced router logs under activation recompute in Megatron "
        "before its fix (Megatron-LM#1330): if the run recomputes (--moe-layer-recompute), halve it."
        if not doubled and value < RECOMPUTE_DOUBLE_MAX
        else ""
    )
    message = (
        f"The load-balancing loss{where} is {value:.3g}{logged} at step {step}, {value:.1f}x its balanced "
        "value 1: routing is as uneven as half the experts idle or worse (Megatron's loss peaks at "
        f"experts / top-k).{maybe_doubled}"
    )
    evidence = {"key": key, "value": value, "balanced": 1.0, "recompute_halved": doubled}
    return Finding("load_collapse", step, "warning", message, evidence, layer=layer)
