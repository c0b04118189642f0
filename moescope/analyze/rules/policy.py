"""``entropy_collapse`` / ``entropy_surge``, ``reward_collapse``, ``no_signal`` and
``degenerate_output``: what the policy's samples and their rewards say."""

from __future__ import annotations

import re

from moescope import schema as S
from moescope.analyze.findings import Finding
from moescope.analyze.rules.frozen import printed_in_text
from moescope.analyze.rules.losses import HELD_OUT_KEY, names_a_loss
from moescope.analyze.rules.series import (
    Shift,
    baseline,
    column,
    fall_from_peak,
    first_logged,
    is_number,
    logged_keys,
    series,
    shift,
    step_of,
    sustained,
    throughout,
)
from moescope.analyze.rules.thresholds import FINE_DIGITS, PINNED_DIGITS, REPLAYED_RUN, SUSTAIN
from moescope.traces import Trace


def _floor(trace: Trace) -> float | None:
    """The OPEFO entropy floor of a moescope replay that ran with it."""
    cfg = trace.header.get("replay_config") or {}
    if cfg.get("token_entropy_flow_control"):
        return float(cfg.get("min_entropy_floor", 0.3))
    return None


def check_entropy(trace: Trace) -> list[Finding]:
    key = first_logged(trace, (S.ENTROPY,))
    if key is None:
        return []
    points, floor = series(trace, key), _floor(trace)
    out = []
    low = shift(
        points,
        lambda v, base: v < 0.5 * base and (floor is None or v < floor),
        positive_base=True,
        gap=lambda base: 0.5 * base,
    )
    if low is not None:
        lowest = min(low.running)
        message = (
            f"Token entropy collapses from step {low.step}: running mean {lowest:.3g} against an "
            f"early level of {low.base:.3g}" + (f" and the OPEFO floor {floor}." if floor else ".")
        )
        evidence = {"key": key, "baseline": low.base, "lowest": lowest, "floor": floor}
        out.append(low.finding("entropy_collapse", "warning", message, **evidence))
    else:
        out += _deterministic(key, points, trace.header.get("format"))
    high = shift(points, lambda v, base: v > max(3 * base, base + 0.5), gap=lambda base: max(2 * base, 0.5))
    if high is not None:
        highest = max(high.running)
        message = (
            f"Token entropy surges from step {high.step}: running mean {highest:.3g} against an early "
            f"level of {high.base:.3g} (the policy is drifting toward noise)."
        )
        out.append(
            high.finding("entropy_surge", "warning", message, key=key, baseline=high.base, highest=highest)
        )
    return out


DETERMINISTIC = 1e-4  # nats: a policy's entropy below this is one action (or token) taken every time


def _deterministic(key: str, points: list[tuple[int, float]], trace_format: str | None) -> list[Finding]:
    """An entropy above 0 and below ``DETERMINISTIC`` on the two or more records a log ends on, or
    on its last after one a hundred times higher: a policy that takes one action every time, too
    few records for a running mean (RLTrader's PPO2, ``policy_entropy`` 0.0051 then 2.8e-09, the
    trial pruned for making no trade). An entropy of exactly 0 is a statistic not computed (a step
    with no sample), and the last column of an ``entropy-log`` may be another quantity (DeePMD's
    learning curve, its numbers read by their shape): neither is judged here."""
    if trace_format == "entropy-log":
        return []
    values = [v for _, v in points]
    run = 0
    while run < len(values) and 0 < values[-1 - run] < DETERMINISTIC:
        run += 1
    fell = run >= 1 and len(values) > run and values[-1 - run] >= 100 * max(values[-1], 1e-300)
    if run < 2 and not fell:
        return []
    step = points[len(points) - run][0]
    message = (
        f"The policy's entropy is {values[-1]:.2g} from step {step}, below {DETERMINISTIC:g} nats: it "
        "takes one action (or token) every time, so its samples teach it nothing new."
    )
    return [Finding("entropy_collapse", step, "warning", message, {"key": key, "lowest": min(values[-run:])})]


REWARD_FALL = 0.2  # a running mean reward below this share of its early level, or of its peak


def check_reward_collapse(trace: Trace) -> list[Finding]:
    """The mean reward's running mean fallen below ``REWARD_FALL`` of its early level or its
    peak; else, in RL, an evaluation's reward or a win or success rate fallen so (QMIX on SMAC
    after a harder map: ``test_avg_winrate`` 0.7 to 0.0 while the training reward still rises)."""
    key = first_logged(trace, (S.REWARD_MEAN,))
    if key is None:
        return []
    for name in (key, *_performance(trace)):
        found = _collapse(name, series(trace, name))
        if found:
            return found
    return []


def _collapse(key: str, points: list[tuple[int, float]]) -> list[Finding]:
    fall = shift(
        points,
        lambda v, base: v < REWARD_FALL * base,
        positive_base=True,
        gap=lambda base: (1 - REWARD_FALL) * base,
    )
    against = "an early level"
    if fall is None:
        fall, against = fall_from_peak(points, REWARD_FALL), "a peak"
    if fall is None:
        fall, against = _fall_below_zero(points), "an early level"
    if fall is None:
        return []
    lowest = min(fall.running)
    what = "Reward" if key == S.REWARD_MEAN else key
    message = (
        f"{what} collapses from step {fall.step}: running mean {lowest:.3g} against {against} of "
        f"{fall.base:.3g}."
    )
    return [fall.finding("reward_collapse", "error", message, key=key, baseline=fall.base, lowest=lowest)]


def _fall_below_zero(points: list[tuple[int, float]]) -> Shift | None:
    """A reward whose early level is below 0 (a cost: control penalties, a distance) and whose
    running mean falls to ``1 / REWARD_FALL`` times that level or lower, and ends there: the
    collapse of a reward that has no positive level to fall to a fifth of (MBPO on HalfCheetah,
    an episode reward of -0.85 falling to -180 and not coming back). A dip that recovers within
    the log is exploration, not a collapse."""
    values = [v for _, v in points]
    base = baseline(values) if len(values) >= SUSTAIN + 3 else 0.0
    if not base < 0:
        return None
    fall = shift(
        points, lambda v, level: v < level / REWARD_FALL, gap=lambda level: -level * (1 / REWARD_FALL - 1)
    )
    return fall if fall is not None and fall.running[-1] < base / REWARD_FALL else None


# what an RL run scores beside its training reward: an evaluation's reward or return, a win or success rate
_PERFORMANCE = re.compile(r"win_?rate|success_?rate")


def _performance(trace: Trace) -> list[str]:
    return [
        key
        for key in logged_keys(trace)
        if _PERFORMANCE.search(low := key.lower())
        or (HELD_OUT_KEY.match(low) and ("reward" in low or "return" in low))
    ]


NO_SIGNAL_KEYS = (S.NO_SIGNAL_FRAC, S.ADVANTAGE_MAX, S.ADVANTAGE_MIN, S.REWARD_STD)  # what _no_signal reads


def _no_signal(rec: dict) -> bool | None:
    """Whether a record says every group's rewards were equal: ``frac_reward_zero_std`` at 1, or
    (without it) every advantage exactly 0, or a reward std of exactly 0; ``None`` when it does
    not say."""

    def number(key: str) -> float | None:
        v = rec.get(key)
        return float(v) if is_number(v) else None

    frac, hi, lo, std = (number(k) for k in NO_SIGNAL_KEYS)
    if frac is not None:
        return frac >= 1.0
    if hi is not None and lo is not None:
        return hi == lo == 0.0
    return None if std is None else std == 0.0


HELD_DECIMALS = 3  # a mean reward printed to three decimals, held: no episode scored otherwise
RESPONSES = (S.LENGTH_MEAN, S.TRUNCATED_FRAC, S.KL, S.PG_LOSS)  # a language model's rollouts, logged


def _never_paid(rec: dict) -> bool | None:
    """For a log without the spread metrics :func:`_no_signal` reads: whether the mean reward is
    exactly 0 (and the highest too, where logged), every response scoring 0; ``None`` without a
    mean reward. slime logs means only (slime#1527: ``rollout/raw_reward`` 0.0, every rollout).
    Judged only for a language model's rollouts (:data:`RESPONSES` logged) and where it holds on
    every record: a game's episodes may pay nothing for a while, and a mean printed to three
    decimals (ML-Agents' ``Mean Reward: 0.000``) is 0 on some records of a healthy run."""
    mean = rec.get(S.REWARD_MEAN)
    if not is_number(mean):
        return None
    top = rec.get(S.REWARD_MAX)
    return float(mean) == 0.0 and (not is_number(top) or float(top) == 0.0)


def check_no_signal(trace: Trace) -> list[Finding]:
    """No reward difference to learn from: every group's rewards equal (:func:`_no_signal`), no
    response ever paid (:func:`_never_paid`), or one mean reward on every record (:func:`_reward_held`)."""
    found = _groups_without_signal(trace) or _reward_held(trace) or _no_episode_finished(trace)
    return found or _never_succeeded(trace)


_SUCCESS = re.compile(r"success[\s_]?rate", re.IGNORECASE)


def _never_succeeded(trace: Trace) -> list[Finding]:
    """A success rate of exactly 0 on every record, ``REPLAYED_RUN`` or more: no episode reached
    its goal, so a sparse reward scored every one the same and the updates have nothing to tell
    apart (DDPG with HER on FetchPush, ``eval success rate is: 0.000`` epoch after epoch)."""
    for key in (key for key in logged_keys(trace) if _SUCCESS.search(key)):
        points = series(trace, key)
        if len(points) < REPLAYED_RUN or any(v != 0 for _, v in points):
            continue
        steps = [s for s, _ in points]
        message = (
            f"{key} is 0 on all {len(points)} records: no episode reached its goal, so a sparse reward "
            "scores every one the same and no update has a better one to learn from (a goal never "
            "reached by chance: hindsight relabelling, a shaped reward, an easier start)."
        )
        return [Finding("no_signal", steps[0], "warning", message, {"steps": steps, "key": key})]
    return []


# the episodes a result counts (RLlib's "episodes_total", "episodes_this_iter"; "episodes")
_EPISODE_COUNTS = re.compile(r"(?:num_)?episodes(?:_total|_this_iter)?")
# the mean length of the episodes a result saw end (RLlib's and Tune's "episode_len_mean", SB3's
# "ep_len_mean")
_EPISODE_LENGTHS = re.compile(r"(?:\w+/)?(?:episode_len(?:gth)?_mean|ep_len_mean)")


def _no_episode_finished(trace: Trace) -> list[Finding]:
    """No episode finished on any record a log holds, by its own count of them at 0 or, without
    a count, by the mean length of the episodes that ended logged NaN, and no mean reward logged
    but NaN: nothing was scored, so the updates learn from no return (RLlib#10416's
    ``episodes_total: 0`` beside ``episode_reward_mean: .nan``; a Tune table's ``episode_len_mean``
    and ``reward`` both ``nan``: an environment that never says ``done``)."""
    if series(trace, S.REWARD_MEAN):  # finite values only
        return []
    counts = [key for key in logged_keys(trace) if _EPISODE_COUNTS.fullmatch(key.lower())]
    lengths = [key for key in logged_keys(trace) if _EPISODE_LENGTHS.fullmatch(key.lower())]
    if counts:
        if any(v != 0 for key in counts for _, v in series(trace, key)):
            return []
        key, steps = counts[0], sorted({s for key in counts for s, _ in series(trace, key)})
        said = "is 0"
    elif lengths and not any(series(trace, key) for key in lengths):
        key = lengths[0]
        steps = [step_of(rec, i) for i, rec in enumerate(trace.steps) if rec.get(key) is not None]
        said = "(a mean over the episodes that ended) is NaN"
    else:
        return []
    if not steps:
        return []
    message = (
        f"{key} {said} on {'every record' if len(steps) > 1 else 'its one record'} and no mean reward "
        "is logged but NaN: no episode has finished, so nothing is scored and the updates have no return "
        "to learn from (an environment that never returns done, an episode longer than the run)."
    )
    return [Finding("no_signal", steps[0], "warning", message, {"steps": steps, "key": key})]


def _reward_held(trace: Trace) -> list[Finding]:
    """The mean reward at one value, to its last digit, on every record of the log, the
    ``REPLAYED_RUN`` or more of them, printed with ``HELD_DECIMALS`` decimals or ``PINNED_DIGITS``
    significant digits: every episode (or every sample) scored the same, so no update sees a
    better or a worse one (DDPG-HER's ``EP_reward:-50.000``, the floor of a 50-step episode that
    never reached its goal, epoch after epoch, its actor's loss climbing). Only beside a loss, the
    updates' own record: an evaluation's episodes all at a solved task's maximum say nothing of
    learning; a reward held at the maximum during training is a solved task, as the message says.
    Without one, a reward printed unrounded to ``FINE_DIGITS`` significant digits or more, no task's
    maximum, is the same episode played again and again (a Q-learner's ``Total rewards in episode 73
    is 3.799999999999999``, episode after episode). Where the spread of the episodes' rewards is
    logged as exactly 0 beside a mean of 0 or below, ``SUSTAIN`` records suffice, however printed
    (:func:`_no_spread_at_floor`)."""
    points = series(trace, S.REWARD_MEAN)
    if len(points) < SUSTAIN or any(v != points[0][1] for _, v in points):
        return []  # the common case, told from the first value that differs
    spread = _no_spread_at_floor(trace, points)
    if len(points) < REPLAYED_RUN and not spread:
        return []
    if len(points) < sum(v is not None for v in column(trace, S.REWARD_MEAN)):
        return []  # a NaN among them: no held value
    digits, decimals = printed_in_text(trace, points)
    if digits < FINE_DIGITS and not spread and not any(map(names_a_loss, logged_keys(trace))):
        return []  # without a loss, no update is logged: an evaluation's episodes (a solved CartPole's 500)
    if decimals < HELD_DECIMALS and digits < PINNED_DIGITS and not spread:
        return []
    value, steps = points[0][1], [s for s, _ in points]
    message = (
        f"The mean reward is {value:.6g} on all {len(points)} records: every episode or sample scores "
        "the same, so no update has a better or a worse one to learn from (a sparse task never "
        "solved, the reward's floor; an environment or a reward function that returns a constant). "
        "If it is the task's highest reward, the task is solved instead."
    )
    return [Finding("no_signal", steps[0], "warning", message, {"steps": steps, "value": value})]


def _no_spread_at_floor(trace: Trace, points: list[tuple[int, float]]) -> bool:
    """Whether the episodes' reward spread is logged as exactly 0 on every record of a mean reward
    of 0 or below: every episode of every period scored the same, and no better than nothing, a
    floor rather than a solved task's maximum (ML-Agents' ``Mean Reward: -5.000. Std of Reward:
    0.000`` summary after summary: a car that never moves forward)."""
    spreads = [key for key in logged_keys(trace) if "std" in (low := key.lower()) and "reward" in low]
    logged = {s: v for key in spreads for s, v in series(trace, key)}
    return bool(spreads) and points[0][1] <= 0 and all(logged.get(s) == 0 for s, _ in points)


def _groups_without_signal(trace: Trace) -> list[Finding]:
    spread = first_logged(trace, NO_SIGNAL_KEYS) is not None
    if not spread and (
        first_logged(trace, (S.REWARD_MEAN,)) is None or first_logged(trace, RESPONSES) is None
    ):
        return []  # a log without these metrics says nothing of it: no record need be read
    if not spread and any(is_number(v) and v != 0 for v in column(trace, S.REWARD_MEAN)):
        return []  # some response paid: a mean of 0 elsewhere is no verdict (see _never_paid)
    flagged = _no_signal if spread else _never_paid
    records = [
        (step_of(rec, i), flag, rec)
        for i, rec in enumerate(trace.steps)
        if (flag := flagged(rec)) is not None
    ]
    if not records or (not spread and not all(flag for _, flag, _ in records)):
        return []  # a mean of 0 is decisive only where the reward never paid in the whole log
    points = [(step, flag) for step, flag, _ in records]
    flags = [flag for _, flag in points]
    dead = [s for s, flag in points if flag]
    excerpt = len(points) < SUSTAIN and len(dead) == len(points)  # a few pasted records, all dead
    # a short excerpt of another framework's log is judged by the records it ends on; a run
    # moescope traced itself (a replay, a TRL run), by SUSTAIN steps whatever its length
    pasted = not str(trace.header.get("format", "moescope")).startswith("moescope")
    gone = next((n for n, flag in enumerate(reversed(flags)) if not flag), len(flags))  # dead at the end
    if len(dead) >= max(SUSTAIN, len(points) // 2) or excerpt:
        # dated where the dead steps first hold for SUSTAIN steps: one early step whose groups
        # happened to agree does not date a signal a later collapse took away
        start = sustained(flags)
        step = dead[0] if start is None else points[start][0]
        message = f"No learning signal on {len(dead)} of {len(points)} steps"
    elif gone >= SUSTAIN or (pasted and gone and len(points) < 2 * SUSTAIN):
        # the signal is gone at the end of the log, however long it ran before (in a short paste,
        # the record it ends on says so)
        step = points[len(points) - gone][0]
        message = f"No learning signal since step {step} ({gone} steps, to the end of the log)"
    else:
        return []
    if spread:
        idle = _idle([rec for _, flag, rec in records if flag])
        why = (
            "every group's rewards were equal, so GRPO advantages were all 0 (prompts too easy or "
            f"too hard, or a policy that collapsed){idle}"
        )
    else:  # decisive as _idle's first reading is: no response scored
        idle = why = (
            "the mean reward is exactly 0, so no response scored: a reward function that never pays "
            "(an answer format it does not parse, a wrong dataset key), nothing to learn from"
        )
    severity = "error" if idle else "warning"
    return [Finding("no_signal", step, severity, f"{message}: {why}.", {"steps": dead})]


def _idle(dead: list[dict]) -> str:
    """What makes the records without a signal decisive (an ``error``), "" when nothing does:
    every response scored exactly 0 on each (the reward never paid: rllm#54, Video-R1#86), or the
    gradient norm was exactly 0 on each (the updates did nothing)."""

    def all_zero(*keys: str) -> bool:
        values = [rec.get(key) for rec in dead for key in keys if key in rec]
        return bool(values) and all(is_number(v) and float(v) == 0.0 for v in values)

    if all(S.REWARD_MEAN in rec for rec in dead) and all_zero(S.REWARD_MEAN, S.REWARD_MAX):
        return "; every response scored 0: the reward never paid, so nothing can be learned"
    if all(S.GRAD_NORM in rec for rec in dead) and all_zero(S.GRAD_NORM):
        return "; the gradient norm was exactly 0 on each: the updates did nothing"
    return ""


def check_degenerate_output(trace: Trace) -> list[Finding]:
    truncated = series(trace, S.TRUNCATED_FRAC)
    lengths = series(trace, S.LENGTH_MEAN)
    lo, hi = series(trace, S.LENGTH_MIN), series(trace, S.LENGTH_MAX)
    start = throughout([v >= 0.99 for _, v in truncated])
    if start is not None:
        step, records = truncated[start][0], len(truncated)
        why = (
            "all responses hit the length limit (a repetition loop, a missing end-of-sequence, or a "
            "limit too short for the answers)"
        )
    else:
        constant = [a[1] == b[1] for a, b in zip(lo, hi, strict=False)] if lo and hi else []
        start = throughout(constant)
        step, records = (lo[start][0] if start is not None else None), len(constant)
        why = "every response has the same length (a repetition loop or a missing end-of-sequence)"
    if step is None:
        return []
    span = (
        f"for {SUSTAIN}+ steps" if records >= SUSTAIN else f"on every one of the {records} record(s) logged"
    )
    return [
        Finding(
            "degenerate_output",
            step,
            "error",
            f"Degenerate output from step {step}: {why}, {span}.",
            {"length_mean": [v for _, v in lengths][-1:]},
        )
    ]
