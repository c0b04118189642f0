"""The kept-expert count: one grammar (``0.25``, ``"1/4"``, ``8``, ``"auto"``) and one set of
routing rules, parsed once where the user's input enters into a :class:`Keep`.

Every entry point that takes ``keep`` (selection, export, cost) builds a :class:`Keep` from it
and the model's routing (experts, top-k, groups), and passes that object on, so the same count is
accepted or refused, with the same sentence, everywhere, and no later step works it out again.
:func:`parse_keep` is the same parse for callers that want the count alone.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from moescope.errors import MoescopeError

AUTO = "auto"
"""The ``keep`` that searches for the smallest kept share reaching a capability target."""

AUTO_RANGE = (Fraction(1, 8), Fraction(1, 2))
"""The kept shares ``keep="auto"`` searches between (:meth:`Keep.candidates`)."""


@dataclass(frozen=True)
class Keep:
    """Experts kept per MoE layer, checked once against the model's routing.

    Attributes
    ----------
    requested : what was asked for, as given (``"1/4"``, ``0.25``, ``8`` or ``"auto"``).
    count : the experts kept per layer; ``None`` under ``"auto"``, whose count is searched
        (:meth:`candidates`).
    num_experts, top_k, n_group, topk_group : the routing the count was checked against
        (``top_k=0``: unknown, not checked).
    allow_top_k : whether keeping exactly ``top_k`` experts is accepted.

    Examples
    --------
    >>> keep = Keep.parse("1/4", 64, 8)
    >>> keep.count, keep.ratio, keep.describe()
    (16, 0.25, '16 of 64 routed experts per layer (25.0%)')
    >>> Keep.parse("auto", 64, 8, allow_auto=True).candidates()[:3]
    [9, 10, 11]
    """

    requested: str | float | int
    count: int | None
    num_experts: int
    top_k: int
    n_group: int = 1
    topk_group: int = 1
    allow_top_k: bool = False

    @classmethod
    def parse(
        cls,
        keep: str | float | int | Keep,
        num_experts: int,
        top_k: int,
        n_group: int = 1,
        *,
        allow_top_k: bool = False,
        topk_group: int | None = None,
        allow_auto: bool = False,
    ) -> Keep:
        """The keep of a fraction (``0.25``), a ratio (``"1/4"``), a count (``8``) or, with
        ``allow_auto``, ``"auto"``, checked against this routing.

        A fraction is rounded to the nearest multiple of ``n_group``. The count must be at most
        ``num_experts`` and above ``top_k`` (equal with ``allow_top_k``); under grouped routing a
        multiple of ``n_group``, at least two per group, and enough in ``topk_group`` groups for
        ``top_k``. A :class:`Keep` already checked against this routing is returned as it is.
        """
        routing = (num_experts, top_k, n_group, topk_group or n_group)
        if isinstance(keep, Keep):
            if keep.routing == routing and (keep.allow_top_k or not allow_top_k):
                return keep
            keep = keep.requested
        base = cls(keep, None, *routing, allow_top_k)
        if keep == AUTO:
            if not allow_auto:
                raise MoescopeError(
                    f"keep={keep!r} searches the kept count, which only an export with a capability "
                    "target does; give a fraction, ratio or count here, e.g. 0.25, 1/4 or 8."
                )
            return base
        return replace(base, count=base.checked(_keep_count(keep, num_experts, n_group)))

    @property
    def routing(self) -> tuple[int, int, int, int]:
        """``(num_experts, top_k, n_group, topk_group)``."""
        return self.num_experts, self.top_k, self.n_group, self.topk_group

    @property
    def searched(self) -> bool:
        """Whether the count is searched (``keep="auto"``) rather than given."""
        return self.count is None

    @property
    def ratio(self) -> float:
        """The kept share of the routed experts; under ``"auto"`` the most the search may keep."""
        if self.count is None:
            return float(AUTO_RANGE[1])
        return self.count / self.num_experts

    def fixed(self) -> int:
        """The count, refused in one sentence under ``"auto"`` (a step that needs one count)."""
        if self.count is None:
            raise MoescopeError(
                "keep=auto searches the kept count, which this step cannot; give a fraction, ratio "
                "or count, e.g. 0.25, 1/4 or 8."
            )
        return self.count

    def with_count(self, count: int) -> Keep:
        """This routing keeping ``count`` experts (one attempt of ``"auto"``), checked."""
        return replace(self, requested=count, count=self.checked(count))

    def problem(self, count: int) -> str | None:
        """Why keeping ``count`` experts would break this routing, or ``None``."""
        return _keep_problem(count, *self.routing, self.allow_top_k)

    def checked(self, count: int) -> int:
        """``count``, or one sentence naming what it breaks and the nearest valid count."""
        issue = self.problem(count)
        if issue is None:
            return count
        valid = [c for c in range(1, self.num_experts + 1) if self.problem(c) is None]
        fix = (
            f"the nearest valid count is {min(valid, key=lambda c: (abs(c - count), -c))}"
            if valid
            else "this model's routing allows no smaller count"
        )
        raise MoescopeError(
            f"keep={self.requested!r} means {count} of {self.num_experts} experts per layer, {issue}; {fix}."
        )

    def candidates(self) -> list[int]:
        """The kept counts ``"auto"`` may try: those from 1/8 to 1/2 of the routed experts that
        this routing allows, ascending; refused in one sentence when there is none."""
        low, high = math.ceil(self.num_experts * AUTO_RANGE[0]), math.floor(self.num_experts * AUTO_RANGE[1])
        valid = [c for c in range(low, high + 1) if self.problem(c) is None]
        if not valid:
            raise MoescopeError(
                f"no kept count from 1/8 to 1/2 of the {self.num_experts} experts suits this model's "
                f"routing (top-k {self.top_k}, {self.n_group} expert groups); give --keep instead of auto."
            )
        return valid

    def describe(self) -> str:
        """One line: the count and share kept, or what ``"auto"`` searches."""
        if self.count is None:
            n = self.num_experts
            return f"auto: the fewest of {n} routed experts per layer (1/8 to 1/2) reaching the target"
        return f"{self.count} of {self.num_experts} routed experts per layer ({self.ratio:.1%})"


def parse_keep(
    keep: str | float | int | Keep,
    num_experts: int,
    top_k: int,
    n_group: int = 1,
    *,
    allow_top_k: bool = False,
    topk_group: int | None = None,
) -> int:
    """Experts kept per layer from a fraction (``0.25``), a ratio (``"1/4"``) or a count (``8``):
    :meth:`Keep.parse`'s count.

    ``top_k=0`` means unknown (no top-k check).

    Examples
    --------
    >>> parse_keep("1/4", 64, 8), parse_keep(0.5, 8, 2), parse_keep(16, 256, 8, n_group=8)
    (16, 4, 16)
    """
    options = {"allow_top_k": allow_top_k, "topk_group": topk_group}
    return Keep.parse(keep, num_experts, top_k, n_group, **options).fixed()


def _keep_count(keep: Any, num_experts: int, n_group: int) -> int:
    value = _parse_keep_value(keep)
    if isinstance(value, numbers.Integral):
        return int(value)
    if value > 1 and float(value).is_integer():
        return int(value)
    if not 0 < value <= 1:
        raise MoescopeError(
            f"keep={keep!r} is neither a fraction in (0, 1] nor a whole count; use e.g. 0.25, 1/4 or 8."
        )
    per_group = Fraction(value) * num_experts / n_group
    return math.floor(per_group + Fraction(1, 2)) * n_group


def _parse_keep_value(keep: Any) -> numbers.Real:
    bad = MoescopeError(f"keep={keep!r} is not a fraction, ratio or count; use e.g. 0.25, 1/4 or 8.")
    if isinstance(keep, bool):
        raise bad
    if isinstance(keep, numbers.Real):
        return keep
    if not isinstance(keep, str):
        raise bad
    text = keep.strip()
    try:
        return int(text) if text.isdigit() else Fraction(text) if "/" in text else float(text)
    except (ValueError, ZeroDivisionError):
        raise bad from None


def _keep_problem(
    count: int, num_experts: int, top_k: int, n_group: int, topk_group: int, allow_top_k: bool
) -> str | None:
    """Why ``count`` kept experts would break the model's routing, or ``None``."""
    if count < 1:
        return "that is no expert at all"
    if count > num_experts:
        return "more than the layers have"
    if count < top_k:
        return f"fewer than the top-k={top_k} experts each token uses"
    if count == top_k and not allow_top_k:
        return (
            f"only top-k={top_k}, so every token would use every kept expert (allow_top_k=True accepts that)"
        )
    if n_group > 1:
        if count % n_group:
            return f"which does not split evenly over the {n_group} expert groups of grouped routing"
        if count // n_group < 2:
            return "under 2 per expert group, and grouped routing scores a group by its best two"
        if count // n_group * topk_group < top_k:
            return f"too few for top-k={top_k} inside the {topk_group} groups a token may use"
    return None
