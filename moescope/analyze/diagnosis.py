"""``diagnose(trace) -> findings``: what went wrong in a training run, and when.

Works on the canonical trace form (a moescope replay, or any log :mod:`moescope.analyze.readers`
reads), so absent metrics are simply not judged. Each check is one function over the step
records; thresholds are module constants, chosen so a healthy toy replay raises nothing
(negative controls in the tests) and written next to each rule:

- ``nonfinite``: the first step with a NaN/±Inf (or a ``null`` that stands for one) and the
  metric families that went first, in pipeline order — log-prob/KL, policy loss, critic,
  gradients; a loss field that vanishes from a step where it is usually logged (Megatron drops
  it) is a *suspected* non-finite loss. Isolated (finite again on the next step) or persistent.
- ``grad_spike``: a gradient norm ``GRAD_SPIKE_FACTOR`` times above the median of the previous
  ``WINDOW`` steps and more than ``GRAD_SPIKE_Z`` robust deviations (MAD of log norms) away; with
  fewer than 3 earlier steps that had a gradient, ``GRAD_SPIKE_EXTREME`` times the median and
  ``GRAD_SPIKE_FACTOR`` times the largest. Steps with a norm of 0 (no signal) are left out.
- ``zero_grad``: a gradient norm of exactly 0 while rewards still vary.
- ``overflow``: the largest episode of fp16 steps skipped by the loss scaler; a short one (the
  scaler settling at the start) is ``info``, a longer one a ``warning``, a scale below 1 an
  ``error``.
- ``loss_divergence``: only on losses that have a level (critic value loss, the LM loss of a run
  that is not RL), never on a GRPO policy loss, whose level is near 0 by construction: the
  running median rises ``DIVERGENCE_FACTOR`` times above the early-run baseline and stays there.
- ``kl_blowup``: KL to the reference jumps above ``KL_BLOWUP_MIN`` nats and ten times its running
  median.
- ``entropy_collapse`` / ``entropy_surge``: the running mean of token entropy falls below half
  the early-run baseline (and under the OPEFO floor, when the run had one) / rises above three
  times it, for ``SUSTAIN`` steps.
- ``reward_collapse``: the running mean reward falls below a fifth of a positive early baseline.
- ``no_signal``: every group's rewards were equal (no GRPO gradient) on most steps.
- ``degenerate_output``: all responses truncated, or a constant response length, for ``SUSTAIN``
  steps.
- ``load_collapse`` (per layer): over a window of steps, one expert takes more than
  ``LOAD_SHARE_FACTOR`` times its uniform share and twice its early-run share, or a quarter of
  the experts that were busy early on receive nothing; or a load-balancing loss twice its early
  value; or, for a log with only the scalar, a load CV above 1 and twice its early value.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.traces import Trace

WINDOW = 10
SUSTAIN = 3
GRAD_SPIKE_FACTOR = 10.0
GRAD_SPIKE_Z = 6.0
GRAD_SPIKE_EXTREME = 1000.0
DIVERGENCE_FACTOR = 5.0
KL_BLOWUP_MIN = 1.0
LOAD_SHARE_FACTOR = 5.0

# metric families in the order a training step computes them (forward before backward)
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "log-prob/KL",
        ("actor/kl", "actor/ppo_kl", "rollout/logprob_mismatch", "actor/kl_loss", "actor/entropy"),
    ),
    ("policy loss", ("actor/loss", "actor/pg_loss", "lm_loss", "lm loss")),
    ("critic", ("critic/vf_loss", "critic/loss", "critic/values/mean")),
    ("gradients", (S.GRAD_NORM, S.CRITIC_GRAD_NORM, S.NONFINITE)),
)
LEVEL_LOSSES = (S.VF_LOSS, "critic/loss", "lm_loss", "lm loss", "actor/sft_loss")
RL_SIGNS = (S.REWARD_MEAN, S.PG_LOSS, S.KL, S.NO_SIGNAL_FRAC)
KL_KEYS = (S.KL, "actor/kl_loss")
SKIP_KEYS = {"step", "kind", "raw", "time/rollout_s", "time/update_s", "time/step_s"}

Series = list[tuple[int, float]]


def diagnose(trace: Trace) -> list[Finding]:
    """All findings of ``trace``, ordered by onset step (findings without a step last)."""
    findings: list[Finding] = []
    for check in CHECKS:
        findings += check(trace)
    return sorted(findings, key=lambda f: (f.step is None, f.step if f.step is not None else 0, f.type))


# --- reading series ----------------------------------------------------------------------------


def _step(record: dict[str, Any], index: int) -> int:
    step = record.get("step")
    return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else index


def series(trace: Trace, key: str, *, finite: bool = True) -> Series:
    """``(step, value)`` of a scalar metric; non-finite values left out unless ``finite=False``."""
    out = []
    for i, rec in enumerate(trace.steps):
        v = rec.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if finite and not math.isfinite(v):
            continue
        out.append((_step(rec, i), float(v)))
    return out


def _first(trace: Trace, keys: Sequence[str]) -> str | None:
    """The first of ``keys`` the trace logs at all."""
    return next((k for k in keys if any(k in rec for rec in trace.steps)), None)


def running(values: Sequence[float], width: int, fn: Callable[[Sequence[float]], float]) -> list[float]:
    """``fn`` over the trailing window of ``width`` values at every position."""
    return [fn(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def _baseline(values: Sequence[float]) -> float:
    """Median of the early run (the first tenth, at least 3 values)."""
    n = max(3, len(values) // 10)
    return statistics.median(values[:n])


def _backdate(values: Sequence[float], start: int, crossed: Callable[[float], bool]) -> int:
    """Move an onset found on a running statistic back to the first raw value that crossed."""
    first = start
    for i in range(start, max(-1, start - SUSTAIN), -1):
        if crossed(values[i]):
            first = i
        else:
            break
    return first


def _sustained(flags: Sequence[bool], length: int = SUSTAIN) -> int | None:
    """Index where ``length`` consecutive True flags start, else None."""
    run = 0
    for i, flag in enumerate(flags):
        run = run + 1 if flag else 0
        if run == length:
            return i - length + 1
    return None


@dataclass(frozen=True)
class _Shift:
    """A sustained move of a running statistic away from the early-run level."""

    step: int
    base: float
    running: list[float]


def _shift(
    points: Series,
    crossed: Callable[[float, float], bool],
    *,
    stat: Callable[[Sequence[float]], float] = statistics.fmean,
    min_points: int = SUSTAIN + 3,
    positive_base: bool = False,
) -> _Shift | None:
    """Where ``crossed(running value, baseline)`` first holds for ``SUSTAIN`` steps, dated back to
    the first raw value that crossed; None when it never does."""
    values = [v for _, v in points]
    if len(values) < min_points:
        return None
    base = _baseline(values)
    if positive_base and base <= 0:
        return None
    trail = running(values, SUSTAIN, stat)
    start = _sustained([crossed(r, base) for r in trail])
    if start is None:
        return None
    return _Shift(points[_backdate(values, start, lambda v: crossed(v, base))][0], base, trail)


# --- non-finite values -------------------------------------------------------------------------


def _bad(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def _family(key: str) -> str:
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
    """Keys that hold a number on some step (a ``null`` there can stand for NaN)."""
    return {
        k
        for rec in trace.steps
        for k, v in rec.items()
        if k not in SKIP_KEYS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def _fp16_skip(rec: dict[str, Any]) -> bool:
    """A step that dynamic loss scaling skipped: its inf gradients are the scaler's business."""
    scale = rec.get(S.LOSS_SCALE)
    return bool(rec.get(S.SKIPPED)) and isinstance(scale, int | float) and scale != 1.0


def check_nonfinite(trace: Trace) -> list[Finding]:
    numeric = _numeric_keys(trace)
    bad_steps: list[tuple[int, list[str]]] = []
    for i, rec in enumerate(trace.steps):
        keys = [k for k, v in rec.items() if k in numeric and _bad(v)]
        if rec.get(S.NONFINITE) and S.NONFINITE not in keys:
            keys.append(S.NONFINITE)
        if keys and _fp16_skip(rec) and all(_family(k) == "gradients" for k in keys):
            continue
        if keys:
            bad_steps.append((_step(rec, i), keys))
    findings = []
    if bad_steps:
        step, keys = bad_steps[0]
        order = [name for name, _ in FAMILIES] + ["other"]
        families = sorted({_family(k) for k in keys}, key=order.index)
        later = [s for s, _ in bad_steps[1:]]
        persistent = len(later) >= SUSTAIN or (later and later[0] == step + 1)
        record = next(r for i, r in enumerate(trace.steps) if _step(r, i) == step)
        module = record.get(S.FIRST_NONFINITE_MODULE)
        where = f", first in module {module}" if module else ""
        findings.append(
            Finding(
                "nonfinite",
                step,
                "error",
                f"First non-finite value at step {step} in {', '.join(families)} "
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
                },
            )
        )
    findings += _vanished_losses(trace, {s for s, _ in bad_steps})
    return findings


def _vanished_losses(trace: Trace, known_bad: set[int]) -> list[Finding]:
    """A loss logged on most steps but missing on some: a suspected non-finite loss."""
    out = []
    n = len(trace.steps)
    for key in (S.ACTOR_LOSS, S.PG_LOSS, S.VF_LOSS):
        present = [key in rec for rec in trace.steps]
        if n < 4 or sum(present) < 0.8 * n or all(present):
            continue
        first_seen = present.index(True)
        missing = [_step(rec, i) for i, rec in enumerate(trace.steps) if i > first_seen and not present[i]]
        missing = [s for s in missing if s not in known_bad]
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


# --- gradients ---------------------------------------------------------------------------------


def check_grad_spike(trace: Trace) -> list[Finding]:
    key = _first(trace, (S.GRAD_NORM,))
    if key is None:
        return []
    points = [(s, v) for s, v in series(trace, key) if v > 0]  # 0: a step without signal
    spikes = []
    for i in range(2, len(points)):
        prev = [math.log(v) for _, v in points[max(0, i - WINDOW) : i]]
        med = statistics.median(prev)
        mad = statistics.median(abs(x - med) for x in prev) * 1.4826
        rise = math.log(points[i][1]) - med
        robust = (
            len(prev) >= 3 and rise > math.log(GRAD_SPIKE_FACTOR) and rise > GRAD_SPIKE_Z * max(mad, 0.05)
        )
        # with little history, only an extreme jump counts: far above the median and the maximum
        extreme = rise > math.log(GRAD_SPIKE_EXTREME) and rise > max(prev) - med + math.log(GRAD_SPIKE_FACTOR)
        if robust or extreme:
            spikes.append((points[i][0], points[i][1], math.exp(med)))
    if not spikes:
        return []
    step, value, base = spikes[0]
    return [
        Finding(
            "grad_spike",
            step,
            "warning",
            f"Gradient norm spikes to {value:.3g} at step {step}, {value / base:.0f}x the running median "
            f"{base:.3g}; {len(spikes)} spike(s) in all.",
            {"key": key, "value": value, "baseline": base, "steps": [s for s, _, _ in spikes]},
        )
    ]


def _reward_varies(rec: dict[str, Any]) -> bool | None:
    std = rec.get(S.REWARD_STD)
    if isinstance(std, int | float) and math.isfinite(std):
        return std > 0
    lo, hi = (
        rec.get(S.REWARD_MIN),
        rec.get(S.REWARD_MAX),
    )
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        return hi > lo
    return None


def check_zero_grad(trace: Trace) -> list[Finding]:
    key = _first(trace, (S.GRAD_NORM,))
    if key is None:
        return []
    steps = [
        _step(rec, i)
        for i, rec in enumerate(trace.steps)
        if rec.get(key) == 0 and _reward_varies(rec) and rec.get(S.NO_SIGNAL_FRAC, 0.0) < 1.0
    ]
    if not steps:
        return []
    return [
        Finding(
            "zero_grad",
            steps[0],
            "warning",
            f"Gradient norm is exactly 0 at step {steps[0]} while rewards still vary "
            f"({len(steps)} such step(s)): the update saw no signal (a detached loss, a masked batch).",
            {"key": key, "steps": steps},
        )
    ]


def _episodes(steps: Sequence[int], gap: int = 2) -> list[list[int]]:
    """Runs of steps no more than ``gap`` apart."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s - runs[-1][-1] <= gap:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def check_overflow(trace: Trace) -> list[Finding]:
    """The largest episode of skipped fp16 steps; a short one at the start is the scaler settling."""
    scale = series(trace, S.LOSS_SCALE)
    if scale and all(v == 1.0 for _, v in scale):
        return []  # no loss scaling: skipped steps were non-finite gradients (see nonfinite)
    skipped = {s: v for s, v in series(trace, S.SKIPPED) if v > 0}
    if not skipped:
        return []
    episodes = _episodes(sorted(skipped))
    worst = max(episodes, key=lambda run: (sum(skipped[s] for s in run), -run[0]))
    halvings = [b[0] for a, b in itertools.pairwise(scale) if b[1] < a[1]]
    lowest = min((v for _, v in scale), default=math.nan)
    if lowest < 1:
        severity = "error"
    elif len(worst) > SUSTAIN:
        severity = "warning"
    else:
        severity = "info"
    total = sum(skipped.values())
    return [
        Finding(
            "overflow",
            worst[0],
            severity,
            f"fp16 overflow from step {worst[0]}: {int(sum(skipped[s] for s in worst))} update(s) skipped on "
            f"{len(worst)} nearby step(s) ({int(total)} in the run), the loss scale fell {len(halvings)} "
            f"time(s) (lowest {lowest:.3g}).",
            {
                "skipped_steps": sorted(skipped),
                "episodes": episodes,
                "skipped": total,
                "halvings": halvings,
                "lowest_scale": lowest,
            },
        )
    ]


# --- losses and KL -----------------------------------------------------------------------------


def level_losses(trace: Trace) -> tuple[str, ...]:
    """Losses whose level means something: critic and LM losses; ``actor/loss`` only when the run
    is not RL (a Megatron pre-training or SFT log maps its ``lm loss`` there)."""
    rl = any(key in rec for rec in trace.steps for key in RL_SIGNS)
    return LEVEL_LOSSES if rl else (*LEVEL_LOSSES, S.ACTOR_LOSS)


def check_loss_divergence(trace: Trace) -> list[Finding]:
    out = []
    for key in level_losses(trace):
        shift = _shift(
            series(trace, key),
            lambda v, base: v > DIVERGENCE_FACTOR * base,
            stat=statistics.median,
            min_points=2 * SUSTAIN + 3,
            positive_base=True,
        )
        if shift is not None:
            peak = max(shift.running)
            out.append(
                Finding(
                    "loss_divergence",
                    shift.step,
                    "error",
                    f"{key} diverges from step {shift.step}: its running median reaches {peak:.3g}, "
                    f"{peak / shift.base:.1f}x the early-run level {shift.base:.3g}.",
                    {"key": key, "baseline": shift.base, "peak": peak},
                )
            )
    return out


def check_kl_blowup(trace: Trace) -> list[Finding]:
    key = _first(trace, KL_KEYS)
    if key is None:
        return []
    points = series(trace, key)
    for i in range(1, len(points)):
        prev = [v for _, v in points[max(0, i - WINDOW) : i]]
        med = statistics.median(prev)
        step, value = points[i]
        if value > KL_BLOWUP_MIN and value > 10 * max(med, 1e-3):
            return [
                Finding(
                    "kl_blowup",
                    step,
                    "error",
                    f"KL to the reference jumps to {value:.3g} nats at step {step} "
                    f"(running median {med:.3g}): the policy left the reference in one step.",
                    {"key": key, "value": value, "baseline": med},
                )
            ]
    return []


# --- entropy, reward, outputs ------------------------------------------------------------------


def _floor(trace: Trace) -> float | None:
    cfg = trace.header.get("replay_config") or {}
    if cfg.get("token_entropy_flow_control"):
        return float(cfg.get("min_entropy_floor", 0.3))
    return None


def check_entropy(trace: Trace) -> list[Finding]:
    key = _first(trace, (S.ENTROPY,))
    if key is None:
        return []
    points, floor = series(trace, key), _floor(trace)
    out = []
    low = _shift(points, lambda v, base: v < 0.5 * base and (floor is None or v < floor), positive_base=True)
    if low is not None:
        lowest = min(low.running)
        out.append(
            Finding(
                "entropy_collapse",
                low.step,
                "warning",
                f"Token entropy collapses from step {low.step}: running mean {lowest:.3g} against an "
                f"early level of {low.base:.3g}" + (f" and the OPEFO floor {floor}." if floor else "."),
                {"key": key, "baseline": low.base, "lowest": lowest, "floor": floor},
            )
        )
    high = _shift(points, lambda v, base: v > max(3 * base, base + 0.5))
    if high is not None:
        highest = max(high.running)
        out.append(
            Finding(
                "entropy_surge",
                high.step,
                "warning",
                f"Token entropy surges from step {high.step}: running mean {highest:.3g} against an early "
                f"level of {high.base:.3g} (the policy is drifting toward noise).",
                {"key": key, "baseline": high.base, "highest": highest},
            )
        )
    return out


def check_reward_collapse(trace: Trace) -> list[Finding]:
    key = _first(trace, (S.REWARD_MEAN,))
    shift = (
        None
        if key is None
        else _shift(series(trace, key), lambda v, base: v < 0.2 * base, positive_base=True)
    )
    if shift is None:
        return []
    lowest = min(shift.running)
    return [
        Finding(
            "reward_collapse",
            shift.step,
            "error",
            f"Reward collapses from step {shift.step}: running mean {lowest:.3g} against an early level "
            f"of {shift.base:.3g}.",
            {"key": key, "baseline": shift.base, "lowest": lowest},
        )
    ]


def check_no_signal(trace: Trace) -> list[Finding]:
    points = series(trace, S.NO_SIGNAL_FRAC)
    if not points:
        return []
    dead = [s for s, v in points if v >= 1.0]
    if len(dead) < max(SUSTAIN, len(points) // 2):
        return []
    return [
        Finding(
            "no_signal",
            dead[0],
            "warning",
            f"No learning signal on {len(dead)} of {len(points)} steps: every group's rewards were equal, "
            "so GRPO advantages were all 0 (prompts too easy or too hard).",
            {"steps": dead},
        )
    ]


def check_degenerate_output(trace: Trace) -> list[Finding]:
    truncated = series(trace, S.TRUNCATED_FRAC)
    lengths = series(trace, S.LENGTH_MEAN)
    lo, hi = series(trace, "response_length/min"), series(trace, "response_length/max")
    start = _sustained([v >= 0.99 for _, v in truncated])
    if start is not None:
        step = truncated[start][0]
        why = "all responses hit the length limit"
    else:
        constant = [a[1] == b[1] for a, b in zip(lo, hi, strict=False)] if lo and hi else []
        start = _sustained(constant)
        step = lo[start][0] if start is not None else None
        why = "every response has the same length"
    if step is None:
        return []
    return [
        Finding(
            "degenerate_output",
            step,
            "error",
            f"Degenerate output from step {step}: {why} for {SUSTAIN}+ steps (a repetition loop or a "
            "missing end-of-sequence).",
            {"length_mean": [v for _, v in lengths][-1:]},
        )
    ]


# --- expert load -------------------------------------------------------------------------------


def _load_windows(trace: Trace) -> tuple[list[int], list[list[list[float]]]]:
    steps, loads = [], []
    for i, rec in enumerate(trace.steps):
        load = rec.get(S.EXPERT_LOAD)
        if isinstance(load, list) and load and all(isinstance(row, list) for row in load):
            steps.append(_step(rec, i))
            loads.append(load)
    return steps, loads


def _mean_rows(rows: Iterable[list[float]]) -> list[float]:
    rows = list(rows)
    return [statistics.fmean(col) for col in zip(*rows, strict=True)]


def check_load_collapse(trace: Trace) -> list[Finding]:
    steps, loads = _load_windows(trace)
    out: list[Finding] = []
    width = max(SUSTAIN, min(WINDOW, len(loads) // 4))
    if len(loads) >= 2 * width:
        for layer in range(len(loads[0])):
            finding = _layer_collapse(layer, steps, [load[layer] for load in loads], width)
            if finding is not None:
                out.append(finding)
    out += _aux_loss_rise(trace)
    if not loads:  # a log with only the scalar: judge the load CV
        out += _load_cv_rise(trace)
    return out


def _load_cv_rise(trace: Trace) -> list[Finding]:
    shift = _shift(
        series(trace, S.LOAD_CV), lambda v, base: v > max(2 * base, 1.0), min_points=2 * SUSTAIN + 3
    )
    if shift is None:
        return []
    return [
        Finding(
            "load_collapse",
            shift.step,
            "warning",
            f"The expert-load CV rises from {shift.base:.3g} to {max(shift.running):.3g} at step "
            f"{shift.step}: tokens concentrate on fewer experts.",
            {"key": S.LOAD_CV, "baseline": shift.base, "peak": max(shift.running)},
        )
    ]


def _layer_collapse(layer: int, steps: list[int], shares: list[list[float]], width: int) -> Finding | None:
    experts = len(shares[0])
    early = _mean_rows(shares[:width])
    early_max = max(early)
    used_early = [v >= 0.5 / experts for v in early]  # experts a task mix never routes to do not count
    for end in range(width, len(shares) + 1):
        window = _mean_rows(shares[end - width : end])
        top = max(window)
        dead = sum(1 for v, used in zip(window, used_early, strict=True) if used and v == 0)
        hot = top > LOAD_SHARE_FACTOR / experts and top > 2 * early_max
        starving = dead >= experts / 4
        if hot or starving:
            step = steps[end - width]
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


def _aux_loss_rise(trace: Trace) -> list[Finding]:
    key = _first(trace, (S.AUX_LOSS,))
    shift = (
        None
        if key is None
        else _shift(
            series(trace, key),
            lambda v, base: v > 2 * base,
            stat=statistics.median,
            min_points=2 * SUSTAIN + 3,
            positive_base=True,
        )
    )
    if shift is None:
        return []
    return [
        Finding(
            "load_collapse",
            shift.step,
            "warning",
            f"The load-balancing loss {key} doubles from its early level {shift.base:.3g} at step "
            f"{shift.step}: routing is concentrating on fewer experts.",
            {"key": key, "baseline": shift.base},
        )
    ]


CHECKS: tuple[Callable[[Trace], list[Finding]], ...] = (
    check_nonfinite,
    check_grad_spike,
    check_zero_grad,
    check_overflow,
    check_loss_divergence,
    check_kl_blowup,
    check_entropy,
    check_reward_collapse,
    check_no_signal,
    check_degenerate_output,
    check_load_collapse,
)
