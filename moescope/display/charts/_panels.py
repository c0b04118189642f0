"""The layers of a trace panel: a line per trace, off-scale markers on its edges, findings as
rules, and the step zoom every panel of a trace chart shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moescope.display.charts._common import UNCLUSTERED, alt, model_colour, unpacked
from moescope.display.charts._series import LOG_METRICS, OFF_SCALE, Curve
from moescope.schema import ACTOR_LOSS, ENTROPY, GRAD_NORM, KL, LOAD_CV, REWARD_MEAN, STEP

METRIC_TITLES = {
    ACTOR_LOSS: "loss",
    GRAD_NORM: "gradient norm",
    ENTROPY: "mean token entropy",
    REWARD_MEAN: "mean reward",
    KL: "KL to the reference",
    LOAD_CV: "expert load CV",
}
SEVERITY_COLOURS = {"info": "#8c8c8c", "warning": "#e0a030", "error": "#d62728"}
OFF_SCALE_SHAPES = ("diamond", "triangle-up", "triangle-down", "circle")
TOP_EDGE = ("NaN", "+Inf")
# The step-axis zoom (drag to pan, wheel to zoom) that every panel of a trace chart shares.
ZOOM = "zoom"
# Below this many drawn points per line, each point is drawn too (a lone finite step shows).
POINTS_SHOWN = 200
EDGE_INSET = 5  # px between an off-scale marker and the panel's edge, so it is not clipped


def trace_panel(
    name: str,
    metric: str,
    curves: Sequence[Curve],
    marks: list[dict[str, Any]],
    models: Sequence[str],
    size: tuple[int, int],
    extra: Sequence[alt.Chart] = (),
) -> alt.LayerChart:
    """One metric: a line per trace, off-scale markers on the edges, findings as rules.

    ``name`` names the line layer: the shared :data:`ZOOM` parameter lists it among its views.
    """
    log = metric in LOG_METRICS
    shown = sum(len(c.line[STEP]) for c in curves)
    few = 0 < shown <= POINTS_SHOWN * len(curves)
    point: Any = alt.OverlayMarkDef(size=18, filled=True) if few else False
    scale, axis = (
        (alt.Scale(type="log"), alt.Axis(format="~e", tickCount=4))
        if log
        else (alt.Scale(zero=False), alt.Axis())
    )
    y = alt.Y("value:Q", title=None, scale=scale, axis=axis)
    line = (
        unpacked([c.line for c in curves], name=name, as_text=True)
        .mark_line(point=point, strokeWidth=1.5, clip=True)
        .encode(
            x=step_x(),
            y=y,
            tooltip=[alt.Tooltip("model:N"), alt.Tooltip(f"{STEP}:Q"), alt.Tooltip("value:Q", format=".4g")],
            **_trace_style(models),
        )
    )
    parts = [line, *extra]
    markers = [m for c in curves for m in c.markers]
    for top in (True, False):
        edge = [m for m in markers if (m["flag"] in TOP_EDGE) == top]
        if edge:
            parts.append(_off_scale_layer(edge, models, EDGE_INSET if top else size[1] - EDGE_INSET))
    if marks:
        parts.append(finding_layer(marks, models))
    if not shown and not markers:
        parts.append(note(f"no {metric} in {'this trace' if len(curves) == 1 else 'these traces'}", size))
    subtitle = f"{metric}{' · log scale' if log else ''}"
    title = alt.Title(METRIC_TITLES.get(metric, metric), subtitle=subtitle, anchor="start", fontSize=12)
    return alt.layer(*parts).properties(title=title, width=size[0], height=size[1])


def step_x(field: str = STEP) -> Any:
    """The step axis every trace panel shares (no zero, no fractional ticks; ``100k`` style labels)."""
    return alt.X(
        f"{field}:Q",
        title=STEP,
        scale=alt.Scale(zero=False, nice=False),
        axis=alt.Axis(format="~s", tickMinStep=1),
    )


def _off_scale_layer(rows: list[dict[str, Any]], models: Sequence[str], y: int) -> alt.Chart:
    """NaN / ±Inf / non-positive-on-log points at pixel height ``y`` (an edge of the panel)."""
    shape = alt.Shape(
        "flag:N", title="off the scale", scale=alt.Scale(domain=list(OFF_SCALE), range=list(OFF_SCALE_SHAPES))
    )
    return (
        alt.Chart(alt.InlineData(values=rows))
        .mark_point(filled=True, size=70, opacity=0.9, clip=True)
        .encode(
            x=step_x(),
            y=alt.value(y),
            shape=shape,
            color=_trace_style(models)["color"],
            tooltip=[
                alt.Tooltip("model:N"),
                alt.Tooltip(f"{STEP}:Q"),
                alt.Tooltip("flag:N", title="value"),
                alt.Tooltip("raw:N", title="logged"),
            ],
        )
    )


def finding_layer(rows: list[dict[str, Any]], models: Sequence[str]) -> alt.Chart:
    """Findings as vertical rules: colour = severity, dashed for the second trace's."""
    severity = alt.Scale(domain=list(SEVERITY_COLOURS), range=list(SEVERITY_COLOURS.values()))
    encoding = {
        "x": step_x(),
        "stroke": alt.Stroke("severity:N", title="finding", scale=severity),
        "tooltip": [
            alt.Tooltip("type:N", title="finding"),
            alt.Tooltip("severity:N"),
            alt.Tooltip(f"{STEP}:Q", title="onset step"),
            alt.Tooltip("model:N", title="trace"),
            alt.Tooltip("message:N"),
        ],
    }
    if len(models) > 1:
        encoding["strokeDash"] = _trace_style(models)["strokeDash"]
    return (
        alt.Chart(alt.InlineData(values=rows))
        .mark_rule(strokeWidth=2, opacity=0.8, clip=True)
        .encode(**encoding)
    )


def _trace_style(models: Sequence[str]) -> dict[str, Any]:
    """Colour (those of the routing histogram) and dash by trace: the second trace's lines and
    findings are dashed, so a proxy curve lying exactly on the original's still shows.
    A single trace gets no legend: the title names it."""
    colour = model_colour(models)
    if len(models) == 1:
        return {"color": colour.legend(None)}
    dashes = alt.Scale(domain=list(models), range=[[1, 0], [5, 3]])
    legend = alt.Legend(symbolType="stroke", symbolStrokeWidth=2)
    return {
        "color": colour.legend(legend),
        "strokeDash": alt.StrokeDash("model:N", scale=dashes, legend=legend),
    }


def note(text: str, size: tuple[int, int]) -> alt.Chart:
    """A grey line of text in the middle of an empty panel."""
    return (
        alt.Chart(alt.InlineData(values=[{"note": text}]))
        .mark_text(color=UNCLUSTERED, fontSize=12)
        .encode(text="note:N", x=alt.value(size[0] / 2), y=alt.value(size[1] / 2))
    )


def zoom(panels: Sequence[Any]) -> Any:
    """The step zoom, bound to the x scale every panel shares; listed on each panel's named layer.

    Pass the panels of the concatenated chart: concatenating renames layers (``name_<position>``).
    """
    views = [_first_unit(panel).name for panel in panels]
    return alt.TopLevelSelectionParameter(
        name=ZOOM,
        select=alt.IntervalSelectionConfig(type="interval", encodings=["x"]),
        bind="scales",
        views=[v for v in views if isinstance(v, str)],
    )


def _first_unit(chart: Any) -> alt.Chart:
    while isinstance(chart, alt.LayerChart):
        chart = chart.layer[0]
    return chart


def trace_subtitle(reduced: bool, max_points: int) -> list[str]:
    """The lines under a trace chart's title: off-scale markers, the zoom, and any reduction."""
    lines = [
        "off the scale: NaN and +Inf on the top edge, -Inf (and ≤ 0 on a log scale) on the bottom",
        "drag to pan the steps of every panel, scroll to zoom, double-click resets",
    ]
    if reduced:
        lines.append(f"long series reduced to ≤ {max_points} points: min and max per bucket of steps")
    return lines
