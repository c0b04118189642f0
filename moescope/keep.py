"""The kept-expert count: one grammar (``0.25``, ``"1/4"``, ``8``) and one set of routing rules.

Every entry point that takes ``keep`` (selection, export, cost) goes through :func:`parse_keep`,
so the same count is accepted or refused, with the same sentence, everywhere.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

from moescope.errors import MoescopeError


def parse_keep(
    keep: str | float | int,
    num_experts: int,
    top_k: int,
    n_group: int = 1,
    *,
    allow_top_k: bool = False,
    topk_group: int | None = None,
) -> int:
    """Experts kept per layer from a fraction (``0.25``), a ratio (``"1/4"``) or a count (``8``).

    A fraction is rounded to the nearest multiple of ``n_group``. The count must be at most
    ``num_experts`` and above ``top_k`` (equal with ``allow_top_k``); under grouped routing a
    multiple of ``n_group``, at least two per group, and enough in ``topk_group`` groups for
    ``top_k``. ``top_k=0`` means unknown (no top-k check).

    Examples
    --------
    >>> parse_keep("1/4", 64, 8), parse_keep(0.5, 8, 2), parse_keep(16, 256, 8, n_group=8)
    (16, 4, 16)
    """
    count = _keep_count(keep, num_experts, n_group)
    groups = topk_group or n_group

    def problem(c: int) -> str | None:
        return _keep_problem(c, num_experts, top_k, n_group, groups, allow_top_k)

    issue = problem(count)
    if issue is None:
        return count
    valid = [c for c in range(1, num_experts + 1) if problem(c) is None]
    fix = (
        f"the nearest valid count is {min(valid, key=lambda c: (abs(c - count), -c))}"
        if valid
        else "this model's routing allows no smaller count"
    )
    raise MoescopeError(f"keep={keep!r} means {count} of {num_experts} experts per layer, {issue}; {fix}.")


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
