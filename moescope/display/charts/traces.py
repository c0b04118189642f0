"""The trace board: small multiples of a replay's health metrics, a proxy's overlaid, findings marked.

Every panel shares one step axis and one zoom (:data:`ZOOM`); values no scale can place (NaN,
±Inf, ≤ 0 on a log scale) are drawn on the panel's edges rather than dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from moescope.display.charts._common import alt, versus
from moescope.display.charts._panels import ZOOM, trace_panel, trace_subtitle, zoom
from moescope.display.charts._series import MAX_POINTS, curve, finding_rows, trace_labels
from moescope.errors import MoescopeError
from moescope.schema import ACTOR_LOSS, ENTROPY, GRAD_NORM, KL, LOAD_CV, REWARD_MEAN

if TYPE_CHECKING:
    from moescope.analyze.findings import Finding
    from moescope.traces import Trace

__all__ = ["DEFAULT_METRICS", "ZOOM", "trace_board"]

DEFAULT_METRICS = (ACTOR_LOSS, GRAD_NORM, ENTROPY, REWARD_MEAN, KL, LOAD_CV)
BOARD_COLUMNS = 3
PANEL_SIZE = (230, 120)


def trace_board(
    original: Trace,
    proxy: Trace | None = None,
    *,
    findings: Sequence[Finding] = (),
    proxy_findings: Sequence[Finding] = (),
    metrics: Sequence[str] = DEFAULT_METRICS,
    max_points: int = MAX_POINTS,
    step_range: tuple[int, int] | None = None,
    labels: tuple[str, str] | None = None,
) -> alt.ConcatChart:
    """Small multiples of a replay's health metrics, the proxy's overlaid: did the failure reproduce?

    Parameters
    ----------
    original, proxy : replay traces; the proxy's curves are drawn over the original's in a
        second colour, on the same step axis.
    findings, proxy_findings : diagnosis findings of each trace, drawn as vertical rules
        (colour = severity, dashed for the proxy's; tooltip = type, severity, message) on the
        panel of the metric they concern (``FINDING_PANELS``; ``nonfinite`` on every panel).
    metrics : trace keys, one panel each; ``LOG_METRICS`` get a log scale.
    max_points : above this many steps a series is reduced to the minimum and maximum of
        ``max_points / 2`` buckets of steps, so spikes survive and a 100,000-step trace stays
        quick to draw; NaN / ±Inf steps are kept (one per kind and bucket).
    step_range : ``(first, last)`` steps to draw (inclusive); default all.
    labels : names of the two traces; default from their headers (``original`` / ``proxy``).

    Values no scale can place are not dropped: NaN and +Inf are drawn as markers on the
    panel's top edge, -Inf (and zero or negative values on a log scale) on its bottom edge,
    and the line breaks there. A step without the metric, or with ``null``, has no point.
    Dragging a panel pans every panel's steps, the mouse wheel zooms them, a double-click resets.

    Examples
    --------
    >>> trace_board(read_trace("toy.jsonl"), read_trace("proxy.jsonl")).save("board.html")  # doctest: +SKIP
    """
    if not metrics:
        raise MoescopeError("trace_board needs at least one metric; pass e.g. metrics=DEFAULT_METRICS.")
    if proxy is None and proxy_findings:
        raise MoescopeError("proxy_findings were given without a proxy trace; pass proxy= as well.")
    traces = [original] + ([proxy] if proxy is not None else [])
    names = list(labels[: len(traces)]) if labels else trace_labels(traces)
    marks = finding_rows(names[0], findings, step_range)
    if proxy is not None:
        marks += finding_rows(names[1], proxy_findings, step_range)
    panels, reduced = _panels(traces, names, metrics, marks, max_points, step_range)
    chart = alt.concat(*panels, columns=BOARD_COLUMNS).resolve_scale(x="shared")
    chart.params = [zoom(chart.concat)]
    subtitle = trace_subtitle(reduced, max_points)
    if marks:
        subtitle.append("vertical rules: findings, coloured by severity (the proxy's dashed)")
    title = f"Replay trace{' · ' + names[0] if proxy is None else versus(names)}"
    # Legends below the panels: three columns of panels fill a notebook's width.
    chart = chart.properties(title=alt.Title(title, subtitle=subtitle, anchor="start"))
    return chart.configure_legend(orient="bottom", direction="horizontal")


def _panels(
    traces: Sequence[Trace],
    names: Sequence[str],
    metrics: Sequence[str],
    marks: list[dict[str, Any]],
    max_points: int,
    step_range: tuple[int, int] | None,
) -> tuple[list[alt.LayerChart], bool]:
    """One panel per metric with the findings that concern it; and whether any series was reduced."""
    panels, reduced = [], False
    for i, metric in enumerate(metrics):
        curves = [
            curve(t, metric, name, max_points, step_range) for t, name in zip(traces, names, strict=True)
        ]
        reduced |= any(c.reduced for c in curves)
        shown = [m for m in marks if m["panel"] in (None, metric)]
        panels.append(trace_panel(f"panel_{i}", metric, curves, shown, names, PANEL_SIZE))
    return panels, reduced
