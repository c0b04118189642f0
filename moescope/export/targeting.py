"""Capability-targeted export: heal a proxy until it keeps enough of the original's task skill,
and ``keep="auto"``, the smallest kept share whose proxy gets there.

A proxy is only useful for RL if it still solves its tasks often enough for groups of samples to
disagree. The checklist's capability check (:func:`~moescope.export.fidelity.validity.capability_of`)
says whether it does: proxy / original accuracy on the tasks in the RL window. Here that figure
becomes a target, ``min_capability``:

- **rounds** (:func:`reach_target`): measure; while under the target, heal ``heal_round`` more
  steps (:class:`~moescope.export.healing.Distillation`: one optimizer state and one stream of
  calibration batches throughout) and measure again, until it passes or ``heal_budget`` steps
  are spent. The measurement is the checklist's own (same tasks, prompts, samples and seeds,
  :class:`CapabilityProbe`), so the last figure of the curve is the one the checklist reports.
- **search** (:func:`search_keep`): the valid kept counts from 1/8 to 1/2 of the routed experts
  (:func:`keep_candidates`) are tried cheapest first at the anchors 1/8, 1/4 and 1/2, stopping
  at the first that passes; then the counts between the last failing anchor and it are bisected.
  Assuming more experts never keep less, that is the smallest passing count in at most
  3 + log2(counts between) attempts, each reusing the one calibration pass. When none passes,
  the attempt that kept the most skill is written, marked failing.

The record, :class:`Targeting`, goes into the manifest under ``"targeting"``: the target and
budget, every attempt with its curve (healing steps → accuracy ratio), the kept count chosen,
whether it passed and, when not, why.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope._util.records import check_kind, jsonable, read_record, write_record
from moescope.export.fidelity.measure import pair_accuracy
from moescope.export.fidelity.records import Check
from moescope.export.fidelity.validity import capability_of, capability_rows
from moescope.export.healing import Distillation, check_trainable
from moescope.export.surgery import build_proxy, keep_of
from moescope.keep import AUTO, Keep
from moescope.models.accuracy import model_accuracy
from moescope.models.view import MoEModel, adapt
from moescope.schema import SCHEMA_VERSION, STEP

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedModel

    from moescope.explore.selection import Selection
    from moescope.export.config import ExportConfig
    from moescope.export.fidelity.agreement import Batch

ANCHORS = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2))
"""The kept shares ``keep="auto"`` tries first, cheapest first; it searches no further out."""


@dataclass(frozen=True)
class Attempt:
    """One kept count, measured and healed toward the target.

    ``curve``: ``(healing steps so far, accuracy ratio)`` after each round, the first before any
    healing; ``passed``: whether the last ratio reached the target.
    """

    keep: int
    keep_ratio: float
    curve: tuple[tuple[int, float], ...]
    passed: bool

    @property
    def before(self) -> float:
        return self.curve[0][1]

    @property
    def after(self) -> float:
        return self.curve[-1][1]

    @property
    def steps(self) -> int:
        return self.curve[-1][0]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["curve"] = [{"steps": steps, "ratio": ratio} for steps, ratio in self.curve]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attempt:
        curve = tuple(
            (int(p["steps"]), math.nan if p["ratio"] is None else float(p["ratio"])) for p in d["curve"]
        )
        return cls(int(d["keep"]), float(d["keep_ratio"]), curve, bool(d["passed"]))


@dataclass(frozen=True)
class Targeting:
    """What a capability-targeted export did: the target, every attempt, the count it kept.

    ``search`` is ``"fixed"`` (one given count) or ``"auto"``; ``reason`` says why the proxy
    misses its target (empty when it passed).
    """

    min_capability: float
    heal_budget: int
    heal_round: int
    lr: float
    search: str
    attempts: tuple[Attempt, ...]
    keep: int
    reason: str = ""

    @property
    def searched(self) -> bool:
        """Whether the kept count was searched (``keep="auto"``) rather than given."""
        return self.search == AUTO

    @property
    def chosen(self) -> Attempt:
        return next(a for a in self.attempts if a.keep == self.keep)

    @property
    def passed(self) -> bool:
        return self.chosen.passed

    def to_frame(self) -> pd.DataFrame:
        """The curves, long form: ``keep, keep_ratio, step, ratio, passed, chosen`` (``step``:
        healing steps so far; ``passed``: whether that attempt reached the target)."""
        import pandas as pd

        rows = [
            (a.keep, a.keep_ratio, steps, ratio, a.passed, a.keep == self.keep)
            for a in self.attempts
            for steps, ratio in a.curve
        ]
        return pd.DataFrame(rows, columns=["keep", "keep_ratio", STEP, "ratio", "passed", "chosen"])

    def text(self, num_experts: int) -> str:
        """Each kept count tried, of ``num_experts`` per layer: its accuracy ratio before and after
        healing, the curve, pass or fail; and, when searched, the count chosen."""
        head = f"capability target {self.min_capability:g} (healing up to {self.heal_budget} steps"
        lines = [f"{head}, {self.heal_round} per round{', keep auto' if self.searched else ''}):"]
        for a in self.attempts:
            curve = ", ".join(f"{steps}: {ratio:.2f}" for steps, ratio in a.curve)
            verdict = "pass" if a.passed else "fail"
            lines.append(
                f"  keep {a.keep} of {num_experts} ({a.keep_ratio:.1%}): accuracy ratio {a.before:.2f} -> "
                f"{a.after:.2f} after {a.steps} healing steps, {verdict} (steps: ratio {curve})"
            )
        if self.searched:
            lines.append(f"  chose keep {self.keep} of {num_experts}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON values (a NaN ratio as ``None``): the manifest's ``"targeting"``."""
        out = asdict(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        out["passed"] = self.passed
        return jsonable({"kind": _KIND, "schema_version": SCHEMA_VERSION, **out})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Targeting:
        """The inverse of :meth:`to_dict` (a manifest's ``"targeting"``)."""
        check_kind(d, _KIND, _FIX)
        values = {f.name: d[f.name] for f in fields(cls)}
        values["attempts"] = tuple(Attempt.from_dict(a) for a in d["attempts"])
        return cls(**values)

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (temporary sibling, then rename)."""
        return write_record(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Targeting:
        """Read a file written by :meth:`save`."""
        return cls.from_dict(read_record(path, _KIND, _FIX))


_KIND = "moescope.targeting"
_FIX = "pass a file written by Targeting.save, or export the proxy again"


# --- measuring -------------------------------------------------------------------------------------


class CapabilityProbe:
    """The checklist's capability figure of one proxy after another.

    The original is measured once (or ``known``: its accuracy frame on ``tasks``, measured
    before or given); a proxy on the tasks the check compares only (the in-window
    families of the task suite, whose figures do not depend on which other families are measured
    with them; all lines of a prompt file), with the same prompts, samples and seed as the
    fidelity measurement, so :meth:`check` gives the figure the checklist will report.
    """

    def __init__(
        self,
        original: PreTrainedModel,
        tokenizer: Any,
        tasks: tuple[str, ...] | list[Any],
        *,
        threshold: float,
        n_prompts: int = 100,
        samples: int = 4,
        seed: int = 0,
        known: pd.DataFrame | None = None,
    ) -> None:
        self.tokenizer, self.tasks, self.threshold = tokenizer, tasks, threshold
        self.options = {"n_prompts": n_prompts, "samples": samples, "seed": seed}
        frame = known if known is not None else model_accuracy(original, tokenizer, tasks, **self.options)
        if isinstance(tasks, tuple):
            _, used, _ = capability_rows(pair_accuracy(frame, frame))
            self.tasks = tuple(task for task in tasks if task in set(used["task"]))
        self.original: pd.DataFrame = frame[frame["task"].isin(_task_names(self.tasks))].reset_index(
            drop=True
        )

    def check(self, proxy: PreTrainedModel) -> Check:
        """The capability check of ``proxy`` against :attr:`threshold`."""
        measured = model_accuracy(proxy, self.tokenizer, self.tasks, **self.options)
        return capability_of(pair_accuracy(self.original, measured), self.threshold)


def _task_names(tasks: tuple[str, ...] | list[Any]) -> set[str]:
    return set(tasks) if isinstance(tasks, tuple) else {example.task for example in tasks}


def ratio_of(check: Check) -> float:
    """The accuracy ratio of a capability check (NaN where the original solves nothing)."""
    return float(check.details.get("ratio", math.nan))


# --- rounds ----------------------------------------------------------------------------------------


def reach_target(
    original: PreTrainedModel,
    proxy: PreTrainedModel,
    selection: Selection,
    probe: CapabilityProbe,
    batches: Iterator[Batch],
    config: ExportConfig,
    teacher: Callable[[], Any] | None = None,
) -> Attempt:
    """Heal ``proxy`` (of ``selection``) in place, ``config.heal_round`` steps at a time, until
    ``probe`` passes it or ``config.heal_budget`` steps are spent; a ratio that cannot be
    measured stops at once. ``teacher`` gives what healing distils from, on the first round
    only (default ``original``; an original read a layer at a time gives its cached
    distributions, :mod:`moescope.export.teacher`)."""
    check = probe.check(proxy)
    curve = [(0, ratio_of(check))]
    run, spent = None, 0
    while not check.passed and spent < config.heal_budget and not math.isnan(curve[-1][1]):
        if run is None:
            check_trainable(proxy)  # before the teacher's pass
            run = Distillation(teacher() if teacher else original, proxy, batches, lr=config.heal_lr)
        steps = min(config.heal_round, config.heal_budget - spent)
        run.train(steps)
        spent += steps
        check = probe.check(proxy)
        curve.append((spent, ratio_of(check)))
    if run is not None:
        run.verify()
    return Attempt(selection.keep, selection.keep_ratio, tuple(curve), check.passed)


def record_fixed(attempt: Attempt, config: ExportConfig) -> Targeting:
    """The :class:`Targeting` record of the one kept count given (:func:`reach_target`'s attempt)."""
    return _record(config, "fixed", [attempt], attempt)


def _record(config: ExportConfig, search: str, attempts: list[Attempt], chosen: Attempt) -> Targeting:
    budget = (config.min_capability, config.heal_budget, config.heal_round, config.heal_lr)
    return Targeting(*budget, search, tuple(attempts), chosen.keep, miss_reason(chosen, config, search))


def miss_reason(attempt: Attempt, config: ExportConfig, search: str = "fixed") -> str:
    """Why ``attempt`` misses the target, in one sentence (empty when it passed)."""
    if attempt.passed:
        return ""
    if math.isnan(attempt.after):
        return "the original solves none of the measured tasks, so no accuracy ratio can be reached"
    reached = f"accuracy ratio {attempt.after:.2f} < {config.min_capability:g} after {attempt.steps} steps"
    if search == AUTO:
        return (
            f"no kept share from 1/8 to 1/2 reached the target within {config.heal_budget} healing "
            f"steps (the best, {attempt.keep} experts: {reached}); raise --heal-budget or lower "
            "--min-capability"
        )
    return (
        f"{reached} of healing (budget {config.heal_budget}); raise --heal-budget, keep more "
        "experts or lower --min-capability"
    )


# --- the search ------------------------------------------------------------------------------------


def keep_candidates(moe: MoEModel, allow_top_k: bool = False) -> list[int]:
    """The kept counts from 1/8 to 1/2 of the routed experts that the model's routing allows
    (top-k, grouped routing: :meth:`moescope.keep.Keep.candidates`)."""
    return keep_of(moe, AUTO, allow_top_k=allow_top_k, allow_auto=True).candidates()


def anchor_counts(candidates: Sequence[int], num_experts: int) -> list[int]:
    """For each of :data:`ANCHORS`, the smallest candidate count at or above that share; ascending."""
    found = {next((c for c in candidates if c >= share * num_experts), None) for share in ANCHORS}
    return sorted(c for c in found if c is not None)


def search_keep(candidates: Sequence[int], passes: Callable[[int], bool], num_experts: int) -> int | None:
    """The smallest of ``candidates`` (ascending) that ``passes``, by the module's search; each
    count is tried at most once. ``None`` when no anchor passes.

    Example
    -------
    >>> tried = []
    >>> search_keep(list(range(4, 17)), lambda count: tried.append(count) or count >= 6, 32), tried
    (6, [4, 8, 6, 5])
    """
    anchors = anchor_counts(candidates, num_experts)
    failed = None
    for count in anchors:
        if passes(count):
            break
        failed = count
    else:
        return None
    between = [c for c in candidates if failed is not None and failed < c < count]
    while between:
        middle = between[len(between) // 2]
        if passes(middle):
            count, between = middle, [c for c in between if c < middle]
        else:
            between = [c for c in between if c > middle]
    return count


def target_auto(
    original: PreTrainedModel,
    select: Callable[[int], Selection],
    probe: CapabilityProbe,
    batches: Iterator[Batch],
    config: ExportConfig,
    cut: Callable[[Selection], PreTrainedModel] | None = None,
    teacher: Callable[[], Any] | None = None,
    keep: Keep | None = None,
) -> tuple[Selection, PreTrainedModel, Targeting]:
    """``keep="auto"``: :func:`search_keep` over :func:`keep_candidates`, each attempt a fresh
    proxy of ``select(count)`` healed by :func:`reach_target` on ``batches`` from their start
    (the same data for every count, made once: RL data samples the original as it goes).
    ``cut`` makes a proxy of a selection (default: from ``original`` in memory), ``teacher``
    is :func:`reach_target`'s; ``keep`` the export's parsed ``"auto"`` (default: parsed from
    ``original``'s routing). Returns the
    chosen selection, its healed proxy and the record; only the proxy that may still be chosen
    is kept in memory between attempts."""
    moe = adapt(original)
    cut = cut or (lambda selection: build_proxy(original, selection))
    attempts: list[Attempt] = []
    held: dict[int, tuple[Selection, PreTrainedModel]] = {}
    replay = _Replay(batches)

    def passes(count: int) -> bool:
        chosen = select(count)
        proxy = cut(chosen)
        attempts.append(reach_target(original, proxy, chosen, probe, iter(replay), config, teacher))
        held[count] = (chosen, proxy)
        best = _best(attempts).keep
        for other in [c for c in held if c != best]:
            del held[other]
        return attempts[-1].passed

    candidates = keep.candidates() if keep is not None else keep_candidates(moe, config.allow_top_k)
    search_keep(candidates, passes, moe.num_experts)
    best = _best(attempts)
    selection, proxy = held[best.keep]
    return selection, proxy, _record(config, AUTO, attempts, best)


def _best(attempts: Sequence[Attempt]) -> Attempt:
    """The smallest passing attempt; with none passing, the one that kept the most skill (the
    larger count on a tie)."""
    passing = [a for a in attempts if a.passed]
    if passing:
        return min(passing, key=lambda a: a.keep)
    return max(attempts, key=lambda a: (-math.inf if math.isnan(a.after) else a.after, a.keep))


class _Replay:
    """An endless iterator made iterable again from its start: what one pass drew is kept for
    the next (at most one attempt's budget of batches)."""

    def __init__(self, items: Iterator[Any]) -> None:
        self._items, self._drawn = items, []

    def __iter__(self) -> Iterator[Any]:
        for i in itertools.count():
            if i == len(self._drawn):
                self._drawn.append(next(self._items))
            yield self._drawn[i]
