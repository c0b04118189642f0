"""The entropy flow: where in the response token entropy collapses, and when.

Token entropy by response-position bucket × step (a heatmap) over the mean entropy line and the
OPEFO floor; both panels share the step zoom of the trace charts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope.display.charts._common import KEPT_STROKE, alt, sig, unpacked
from moescope.display.charts._panels import finding_layer, note, step_x, trace_panel, trace_subtitle, zoom
from moescope.display.charts._series import MAX_POINTS, curve, finding_rows, trace_labels
from moescope.schema import ENTROPY, STEP, TOKEN_ENTROPY

if TYPE_CHECKING:
    from moescope.analyze.findings import Finding
    from moescope.traces import Trace

__all__ = ["NONFINITE_COLOUR", "entropy_flow"]

ENTROPY_FINDINGS = ("entropy_collapse", "entropy_surge")
NONFINITE_COLOUR = "#d62728"
FLOW_WIDTH = 560
FLOW_ROW_HEIGHT = 20


def entropy_flow(
    trace: Trace,
    *,
    floor: float | None = None,
    findings: Sequence[Finding] = (),
    max_points: int = MAX_POINTS,
    step_range: tuple[int, int] | None = None,
) -> alt.VConcatChart:
    """Where in the response entropy collapses, and when: position buckets × steps over the mean line.

    Parameters
    ----------
    trace : a replay trace with ``actor/token_entropy`` summaries (mean entropy per bucket of
        response positions) and ``actor/entropy``.
    floor : the OPEFO entropy floor, drawn as a dashed rule under the mean; default the trace's
        ``min_entropy_floor`` when its replay ran with ``token_entropy_flow_control``, else none.
    findings : findings of the trace; the ``entropy_collapse`` / ``entropy_surge`` ones are
        drawn as vertical rules on both panels.
    max_points, step_range : as in :func:`~moescope.display.charts.trace_board`. The heatmap has
        at most one column per pixel; a column over many steps shows their token-weighted mean.

    Heatmap cells whose steps include a NaN or ±Inf are outlined in red (filled red when no
    step of the cell is finite); empty buckets (no response that long) have no cell.

    Examples
    --------
    >>> entropy_flow(read_trace("toy.jsonl"), floor=0.3).save("entropy.png")  # doctest: +SKIP
    """
    (name,) = trace_labels([trace])
    floor = _entropy_floor(trace) if floor is None else floor
    marks = [m for m in finding_rows(name, findings, step_range) if m["type"] in ENTROPY_FINDINGS]
    heat = _entropy_heatmap(trace, marks, step_range, min(max_points, FLOW_WIDTH))
    line_data = curve(trace, ENTROPY, name, max_points, step_range)
    extra = [] if floor is None else [_floor_rule(floor)]
    line = trace_panel("entropy_line", ENTROPY, [line_data], marks, [name], (FLOW_WIDTH, 150), extra)
    chart = alt.vconcat(heat, line).resolve_scale(x="shared", color="independent")
    chart.params = [zoom(chart.vconcat)]
    subtitle = trace_subtitle(line_data.reduced, max_points)
    if floor is not None:
        subtitle.append(f"dashed: the OPEFO entropy floor ({floor:g})")
    title = alt.Title(f"Token entropy over steps · {name}", subtitle=subtitle, anchor="start")
    return chart.properties(title=title)


def _entropy_floor(trace: Trace) -> float | None:
    """The floor OPEFO held entropy to in this replay, if it ran with token-entropy flow control."""
    config = trace.header.get("replay_config") or {}
    if config.get("token_entropy_flow_control") and config.get("min_entropy_floor") is not None:
        return float(config["min_entropy_floor"])
    return None


def _floor_rule(floor: float) -> alt.Chart:
    return (
        alt.Chart(alt.InlineData(values=[{"floor": floor}]))
        .mark_rule(strokeDash=[6, 3], strokeWidth=1.5, color=KEPT_STROKE)
        .encode(y="floor:Q", tooltip=[alt.Tooltip("floor:Q", title="OPEFO entropy floor")])
    )


def _entropy_heatmap(
    trace: Trace, marks: list[dict[str, Any]], step_range: tuple[int, int] | None, columns: int
) -> alt.LayerChart:
    """Mean token entropy per response-position bucket (rows) and column of steps."""
    labels, steps, means, tokens = _token_entropy(trace, step_range)
    size = (FLOW_WIDTH, FLOW_ROW_HEIGHT * max(len(labels), 3))
    title = alt.Title("entropy by response position", subtitle=TOKEN_ENTROPY, anchor="start", fontSize=12)
    if not len(steps):
        empty = note("no token-entropy summaries in this trace", size)
        return alt.layer(empty).properties(title=title, width=size[0], height=size[1])
    rows, broken = _entropy_cells(labels, steps, means, tokens, columns)
    y = alt.Y("position:O", title="response position", sort=labels, axis=alt.Axis(labelAngle=0))
    cells = [
        alt.Tooltip("position:N", title="positions"),
        alt.Tooltip("first:Q", title="from step"),
        alt.Tooltip("last:Q", title="to step"),
    ]
    heat = (
        unpacked(rows, name="entropy_heatmap", as_text=True)
        .mark_rect(clip=True)
        .encode(
            x=step_x("start"),
            x2="end:Q",
            y=y,
            color=alt.Color("entropy:Q", title=["mean entropy", "(nats)"], scale=alt.Scale(scheme="viridis")),
            tooltip=[*cells, alt.Tooltip("entropy:Q", title="mean entropy", format=".3g"), "tokens:Q"],
        )
    )
    parts = [heat]
    if broken:
        parts.append(
            alt.Chart(alt.InlineData(values=broken))
            .mark_rect(stroke=NONFINITE_COLOUR, strokeWidth=1.5, fill=NONFINITE_COLOUR, clip=True)
            .encode(
                x=step_x("start"),
                x2="end:Q",
                y=y,
                fillOpacity=alt.condition("datum.finite", alt.value(0), alt.value(1)),
                tooltip=[*cells, alt.Tooltip("nonfinite:Q", title="steps with NaN/Inf")],
            )
        )
    if marks:
        parts.append(finding_layer(marks, [marks[0]["model"]]))
    return alt.layer(*parts).properties(title=title, width=size[0], height=size[1])


def _token_entropy(
    trace: Trace, step_range: tuple[int, int] | None
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Bucket labels, and per step with a summary: ``(n,)`` steps, ``(n, B)`` means and token counts.

    A bucket's mean is ``nan``/``±inf`` as logged, and ``nan`` with 0 tokens where it was ``null``
    (no response reached it).
    """
    summaries = [
        (s.get(STEP, i), s[TOKEN_ENTROPY])
        for i, s in enumerate(trace.steps)
        if isinstance(s.get(TOKEN_ENTROPY), dict)
        and (step_range is None or step_range[0] <= s.get(STEP, i) <= step_range[1])
    ]
    if not summaries:
        return [], np.zeros(0, np.int64), np.zeros((0, 0)), np.zeros((0, 0))
    buckets = summaries[0][1].get("position_buckets") or []
    width = len(buckets) or max(len(s.get("bucket_mean") or []) for _, s in summaries)
    labels = [_position_label(b) for b in buckets] or [str(i) for i in range(width)]
    means = np.full((len(summaries), width), np.nan)
    tokens = np.zeros((len(summaries), width))
    for row, (_, summary) in enumerate(summaries):
        for col, (mean, count) in enumerate(
            zip(summary.get("bucket_mean") or [], summary.get("bucket_tokens") or [1] * width, strict=False)
        ):
            if col < width and isinstance(mean, int | float):
                means[row, col], tokens[row, col] = mean, max(count or 0, 1)
    steps = np.array([step for step, _ in summaries], np.int64)
    order = np.argsort(steps, kind="stable")
    return labels, steps[order], means[order], tokens[order]


def _position_label(bucket: Sequence[int | None]) -> str:
    """``[2, 4]`` → ``"2–3"``; ``[16, None]`` → ``"16+"``; ``[0, 1]`` → ``"0"``."""
    low, high = bucket
    if high is None:
        return f"{low}+"
    return str(low) if high - low == 1 else f"{low}–{high - 1}"


def _entropy_cells(
    labels: Sequence[str], steps: np.ndarray, means: np.ndarray, tokens: np.ndarray, columns: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Packed heatmap cells per bucket over at most ``columns`` columns of consecutive steps, and
    the cells holding a NaN / ±Inf step (with ``finite``: whether the cell also has a mean)."""
    n = len(steps)
    column = np.arange(n) * min(n, columns) // n
    starts = np.flatnonzero(np.r_[True, np.diff(column) != 0])
    gap = float(np.median(np.diff(steps))) if n > 1 else 1.0
    lefts = steps[starts] - gap / 2
    rights = np.r_[lefts[1:], steps[-1] + gap / 2]
    firsts, lasts = steps[starts], steps[np.r_[starts[1:] - 1, n - 1]]
    finite = np.isfinite(means)
    weights = np.where(finite, tokens, 0.0)
    weight = np.add.reduceat(weights, starts, axis=0)  # (columns, B)
    total = np.add.reduceat(np.where(finite, means, 0.0) * weights, starts, axis=0)
    bad = np.add.reduceat((tokens > 0) & ~finite, starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / weight
    rows, broken = [], []
    for b, label in enumerate(labels):
        has = weight[:, b] > 0
        rows.append(
            {
                "position": label,
                "start": lefts[has].tolist(),
                "end": rights[has].tolist(),
                "first": firsts[has].tolist(),
                "last": lasts[has].tolist(),
                "entropy": sig(mean[has, b]),
                "tokens": weight[has, b].astype(int).tolist(),
            }
        )
        broken += [
            {
                "position": label,
                "start": float(lefts[c]),
                "end": float(rights[c]),
                "first": int(firsts[c]),
                "last": int(lasts[c]),
                "nonfinite": int(bad[c, b]),
                "finite": bool(has[c]),
            }
            for c in np.flatnonzero(bad[:, b])
        ]
    return rows, broken
