"""Charts of routing, expert embeddings, selections and replay traces: pure ``result → altair.Chart``.

Every function reads results (:class:`~moescope.explore.routing.RoutingStats`,
:class:`~moescope.explore.embeddings.ExpertEmbeddings`, :class:`~moescope.explore.clustering.Selection`,
:class:`~moescope.traces.Trace`, :class:`~moescope.analyze.findings.Finding`), never a model, and
returns a chart of data already aggregated to one value per (layer, expert). The data travel
packed, one row per layer holding a list per column (``expert``, ``load_share``, ...), floats
rounded to three significant digits; the chart's first transform, a Vega-Lite ``flatten``,
turns them into long form, one row per (layer, expert). That keeps a 58-layer × 256-expert
heatmap near 150 kB of spec instead of 800 kB of repeated keys.

- :func:`expert_map`: the 2-D projection of a layer's experts; colour = cluster, kept experts
  filled diamonds, dropped ones hollow circles, size = token share.
- :func:`routing_histogram`: one layer's load share per expert, optionally beside a second
  model's (a proxy), aligned on original expert ids.
- :func:`routing_heatmap`: layers × experts overview of the load relative to a uniform router.
- :func:`trace_board`: small multiples of a replay's loss, gradient norm, entropy, reward, KL
  and load CV, a proxy's overlaid, findings marked; one step zoom for all panels.
- :func:`entropy_flow`: token entropy by response position × step over the mean entropy line
  and the OPEFO floor.

Traces travel packed the same way, one row per (trace, metric) holding ``step`` and ``value``
lists; a series longer than ``max_points`` keeps each bucket's minimum and maximum, so a
100,000-step trace stays a few hundred kB and spikes survive.

With ``layer=None`` the first two carry every layer and a slider (a Vega-Lite parameter bound
to an input) that picks the layer inside the chart, so they stay interactive in the static
HTML report, with no kernel.

Examples
--------
>>> from moescope.display.charts import routing_heatmap
>>> chart = routing_heatmap(stats)  # doctest: +SKIP
>>> chart.save("heatmap.png")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope.errors import MoescopeError
from moescope.schema import (
    ACTOR_LOSS,
    CLUSTER,
    ENTROPY,
    EXPERT,
    GRAD_NORM,
    KL,
    LAYER,
    LOAD_CV,
    REWARD_MEAN,
    STEP,
    TOKEN_ENTROPY,
)

try:
    import altair as alt
except ImportError:  # pragma: no cover - the notebook extra is missing
    raise MoescopeError(
        "moescope charts need altair; install the notebook extras with pip install 'moescope[notebook]'."
    ) from None

if TYPE_CHECKING:
    import pandas as pd

    from moescope.analyze.findings import Finding
    from moescope.explore.embeddings import ExpertEmbeddings
    from moescope.explore.routing import RoutingStats
    from moescope.explore.selection import Selection
    from moescope.traces import Trace

__all__ = [
    "BRUSH",
    "DEFAULT_METRICS",
    "PICK",
    "ZOOM",
    "entropy_flow",
    "expert_map",
    "routing_heatmap",
    "routing_histogram",
    "study_chart",
    "trace_board",
]

# Names of the expert map's selection parameters; ``moescope.display.widgets`` reads them back.
PICK = "pick"
BRUSH = "brush"
# The in-chart layer control's parameter (``layer=None``).
LAYER_PARAM = "layer_shown"

SIGNIFICANT_DIGITS = 3
# Vega's "tableau20" scheme, spelled out so unclustered experts can be grey in the same scale.
TABLEAU20 = tuple(
    "#4c78a8 #9ecae9 #f58518 #ffbf79 #54a24b #88d27a #b79a20 #f2cf5b #439894 #83bcb6 "  # noqa: SIM905
    "#e45756 #ff9d98 #79706e #bab0ac #d67195 #fcbfd2 #b279a2 #d6a5c9 #9e765f #d8b5a5".split()
)
UNCLUSTERED = "#999999"  # grey for experts in no cluster (label -1, the baselines)
KEPT_STROKE = "#222222"
ABSENT = "#c8c8c8"  # heatmap background: experts the second model does not have
MODEL_COLOURS = ("#4c78a8", "#f58518")
MAP_SIZE = (380, 340)
HISTOGRAM_SIZE = (560, 220)
HEATMAP_WIDTH = 560
# Relative load (share × experts) shown on the heatmap's colour scale; beyond is clamped.
RELATIVE_LOAD_MAX = 4.0
# Above this many experts the axes label every ``E / AXIS_TICKS``-th expert only.
AXIS_TICKS = 16


# --------------------------------------------------------------------------------- expert map


def expert_map(
    embeddings: ExpertEmbeddings,
    selection: Selection | None = None,
    stats: RoutingStats | None = None,
    *,
    layer: int | None = None,
) -> alt.Chart:
    """Scatter of the experts' 2-D projection: one point per expert of one layer.

    Parameters
    ----------
    embeddings : projected embeddings (``embeddings.project()``: ``coords`` is set).
    selection : colours experts by cluster and marks the kept ones (filled diamond, dark
        outline) against the dropped ones (hollow circle).
    stats : routing statistics of the same model; point size = token share, and the tooltip
        adds token share and saliency.
    layer : decoder layer to show; ``None`` carries every layer plus an in-chart slider.

    Positions are scaled per layer into the unit square (a projection's units mean nothing).
    Clicking an expert picks it (shift-click adds), dragging picks a rectangle, double-click
    clears; the picks are the parameters ``PICK`` and ``BRUSH``.

    Examples
    --------
    >>> chart = expert_map(embeddings.project(), selection, stats, layer=0)  # doctest: +SKIP
    >>> chart.to_dict()["mark"]["type"]  # doctest: +SKIP
    'point'
    """
    if embeddings.coords is None:
        raise MoescopeError(
            "these expert embeddings have no 2-D coordinates; call embeddings.project() first."
        )
    layers = _layers_to_show(embeddings.layers, layer)
    rows = _map_rows(embeddings, layers, selection, stats)
    chart = _unpacked(rows)
    if selection is not None:
        chart = chart.transform_calculate(role="datum.kept ? 'kept' : 'dropped'")
    chart = chart.mark_point(filled=True, strokeWidth=1.5).encode(
        x=alt.X("x:Q", title="projection 1", scale=alt.Scale(domain=[-0.05, 1.05]), axis=_BLANK_AXIS),
        y=alt.Y("y:Q", title="projection 2", scale=alt.Scale(domain=[-0.05, 1.05]), axis=_BLANK_AXIS),
        tooltip=_map_tooltip(selection is not None, stats is not None),
        **_map_marks(rows, selection is not None, stats is not None),
    )
    pick = alt.selection_point(name=PICK, fields=[LAYER, EXPERT], on="click", clear="dblclick")
    brush = alt.selection_interval(name=BRUSH, encodings=["x", "y"], clear="dblclick")
    chart = chart.add_params(pick, brush)
    title = _title(f"Experts of layer {{}} · {embeddings.view} embedding", layers, layer)
    subtitle = _map_subtitle(selection is not None, stats is not None)
    chart = chart.properties(
        title=alt.Title(title, subtitle=subtitle, anchor="start"), width=MAP_SIZE[0], height=MAP_SIZE[1]
    )
    return _with_layer_control(chart, layers, layer)


_SHARE_TOOLTIP = alt.Tooltip("load_share:Q", title="token share", format=".2%")
_BLANK_AXIS: dict[str, Any] = {"labels": False, "ticks": False, "domain": False, "grid": False}


def _map_rows(
    embeddings: ExpertEmbeddings,
    layers: Sequence[int],
    selection: Selection | None,
    stats: RoutingStats | None,
) -> list[dict[str, Any]]:
    _check_same_model(embeddings.num_experts, selection, stats)
    rows = []
    for layer in layers:
        xy = _unit_square(embeddings.coords[embeddings.layers.index(layer)])
        columns: dict[str, Iterable[Any]] = {"x": xy[:, 0].tolist(), "y": xy[:, 1].tolist()}
        if selection is not None:
            columns |= _selection_columns(selection, layer)
        if stats is not None:
            row = stats.layer_index(layer)
            columns |= {"load_share": _sig(stats.load_share[row]), "saliency": _sig(stats.saliency[row])}
        rows.append(_packed(layer, range(embeddings.num_experts), columns))
    return rows


def _selection_columns(selection: Selection, layer: int) -> dict[str, list[Any]]:
    entry = next((e for e in selection.layers if e.layer == layer), None)
    if entry is None:
        raise MoescopeError(
            f"the selection has no decoder layer {layer} (it covers {selection.layer_indices}); "
            "pass the selection made from these embeddings."
        )
    kept = set(entry.kept)
    return {CLUSTER: list(entry.labels), "kept": [e in kept for e in range(selection.num_experts)]}


def _map_marks(rows: list[dict[str, Any]], clustered: bool, routed: bool) -> dict[str, Any]:
    """Fill, stroke, shape, size, opacity and draw order of the expert map's points."""
    marks: dict[str, Any] = {"opacity": alt.condition(_PICKED, alt.value(0.95), alt.value(0.2))}
    if routed:
        marks["size"] = alt.Size(
            "load_share:Q",
            title="token share",
            scale=alt.Scale(range=[25, 420]),
            legend=alt.Legend(format=".0%", tickCount=4),
        )
    else:
        marks["size"] = (
            alt.condition("datum.kept", alt.value(150), alt.value(70)) if clustered else alt.value(80)
        )
    if not clustered:
        return marks | {"color": alt.value(MODEL_COLOURS[0])}
    scale = _cluster_scale(sorted({label for row in rows for label in row[CLUSTER]}))
    legend = alt.Legend(
        title=CLUSTER,
        columns=1 + len(scale.domain) // 14,
        symbolLimit=60,
        labelExpr="datum.value < 0 ? 'none' : datum.label",
    )
    kept = "datum.kept"
    return marks | {
        "fill": alt.condition(kept, alt.Fill(f"{CLUSTER}:N", scale=scale, legend=legend), alt.value("white")),
        "stroke": alt.condition(
            kept, alt.value(KEPT_STROKE), alt.Stroke(f"{CLUSTER}:N", scale=scale, legend=legend)
        ),
        "shape": alt.Shape(
            "role:N",
            title=None,
            scale=alt.Scale(domain=["kept", "dropped"], range=["diamond", "circle"]),
            legend=None,
        ),
        "order": alt.Order("kept:N", sort="ascending"),
    }


def _cluster_scale(labels: Sequence[int]) -> Any:
    """Cluster colours; experts in no cluster (label ``-1``) are grey."""
    palette = TABLEAU20[::2] + TABLEAU20[1::2]  # the ten strong colours first, then their light pairs
    colours = [palette[i % len(palette)] for i in range(len(labels))]
    if labels and labels[0] < 0:
        colours = [UNCLUSTERED, *colours[:-1]]
    return alt.Scale(domain=list(labels), range=colours)


# Experts picked by click or brush; with no pick at all, every expert counts as picked.
_PICKED = (
    f"!(length(data('{PICK}_store')) || length(data('{BRUSH}_store')))"
    f" || vlSelectionTest('{PICK}_store', datum) || vlSelectionTest('{BRUSH}_store', datum)"
)


def _map_tooltip(clustered: bool, routed: bool) -> list[Any]:
    tips = [alt.Tooltip(f"{EXPERT}:O"), alt.Tooltip(f"{LAYER}:O")]
    if clustered:
        tips += [alt.Tooltip(f"{CLUSTER}:N"), alt.Tooltip("role:N", title="in the proxy")]
    if routed:
        tips += [
            _SHARE_TOOLTIP,
            alt.Tooltip("saliency:Q", format=".3g"),
        ]
    return tips


def _map_subtitle(clustered: bool, routed: bool) -> list[str]:
    parts = ["colour = cluster", "filled diamond = kept", "hollow circle = dropped"] if clustered else []
    if routed:
        parts.append("size = token share")
    legend = [" · ".join(parts)] if parts else []
    return [*legend, "click or drag to pick experts · double-click clears"]


def _unit_square(xy: np.ndarray) -> np.ndarray:
    """Shift and scale 2-D points into [0, 1]² keeping their aspect ratio, centred."""
    xy = np.asarray(xy, dtype=np.float64)
    low, high = xy.min(axis=0), xy.max(axis=0)
    scale = float((high - low).max()) or 1.0
    centred = (xy - (low + high) / 2) / scale + 0.5
    return np.round(centred, 3)


# --------------------------------------------------------------------------- load histogram


def routing_histogram(
    stats: RoutingStats,
    other: RoutingStats | None = None,
    *,
    layer: int | None = None,
    sort_by_load: bool = False,
    labels: tuple[str, str] = ("original", "proxy"),
    selection: Selection | None = None,
) -> alt.LayerChart:
    """Load share per expert of one layer: bars, with ``other``'s beside them.

    Parameters
    ----------
    stats : routing statistics of the original model.
    other : a second model's statistics (a proxy, or the same model after training). With the
        same expert count, experts align by index. With fewer (a proxy), pass ``selection``, the
        selection the proxy was cut with: proxy expert ``j`` of a layer is original expert
        ``selection.kept(layer)[j]``, and its bar stands there; dropped experts have none.
    layer : decoder layer to show; ``None`` carries every layer plus an in-chart slider.
    sort_by_load : order experts by ``stats``' load share, busiest first.
    labels : names of ``stats`` and ``other`` in the legend.
    selection : with ``other``, aligns it (above) and marks, with a black tick over each kept
        expert's proxy bar, the original share of that expert's whole cluster: the share a
        faithful proxy expert carries.

    The dashed rules are the share of a perfectly balanced router (``1 / experts``).

    Examples
    --------
    >>> routing_histogram(stats, layer=0, sort_by_load=True).save("load.png")  # doctest: +SKIP
    """
    layers = _layers_to_show(stats.layers, layer)
    names = labels[:1] if other is None else labels
    rows = _load_rows(_load_series(stats, other, selection, layers, names), layers)
    x = alt.X(
        f"{EXPERT}:N",
        title="expert, busiest first" if sort_by_load else EXPERT,
        sort=alt.EncodingSortField("sort_key", op="max", order="descending") if sort_by_load else "ascending",
        axis=_id_axis(stats.num_experts, sorted_=sort_by_load),
    )
    bars = _unpacked(rows).mark_bar(color=MODEL_COLOURS[0])
    if sort_by_load:
        first = (
            f"datum.model === {json.dumps(names[0])} ? datum.load_share : 0" if other else "datum.load_share"
        )
        bars = bars.transform_calculate(sort_key=first)
    bars = bars.encode(
        x=x,
        y=alt.Y("load_share:Q", title="token share", axis=alt.Axis(format="%")),
        tooltip=[alt.Tooltip(f"{EXPERT}:O"), *_model_tooltip(other), _SHARE_TOOLTIP],
        **_model_encoding(names),
    )
    parts = [bars, _uniform_rules(stats, other, layers, names)]
    if selection is not None and other is not None:
        parts.append(_cluster_ticks(stats, selection, layers, x, names))
    title = _title(f"Token share per expert · layer {{}}{_versus(names)}", layers, layer)
    chart = alt.layer(*parts).properties(
        title=alt.Title(title, subtitle=_histogram_subtitle(len(parts) == 3), anchor="start"),
        width=HISTOGRAM_SIZE[0],
        height=HISTOGRAM_SIZE[1],
    )
    return _with_layer_control(chart, layers, layer)


def _load_series(
    stats: RoutingStats,
    other: RoutingStats | None,
    selection: Selection | None,
    layers: Sequence[int],
    names: Sequence[str],
) -> dict[str, dict[int, np.ndarray]]:
    """Per model name, per layer: ``(E,)`` load shares on original expert ids (nan: absent)."""
    series = {names[0]: {layer: stats.load_share[stats.layer_index(layer)] for layer in layers}}
    if other is not None:
        series[names[1]] = _aligned_shares(stats, other, selection, layers)
    return series


def _aligned_shares(
    stats: RoutingStats, other: RoutingStats, selection: Selection | None, layers: Sequence[int]
) -> dict[int, np.ndarray]:
    """``other``'s load shares placed on ``stats``' expert ids."""
    missing = [layer for layer in layers if layer not in other.layers]
    if missing:
        raise MoescopeError(
            f"the second routing statistics have no decoder layers {missing}; compare statistics of "
            "the same model and its proxy."
        )
    if other.num_experts == stats.num_experts:
        return {layer: other.load_share[other.layer_index(layer)] for layer in layers}
    if selection is None or selection.keep != other.num_experts:
        raise MoescopeError(
            f"the second statistics have {other.num_experts} experts per layer and the first "
            f"{stats.num_experts}; pass selection= (the Selection the proxy was cut with, keeping "
            f"{other.num_experts}) so that proxy experts line up with original ids."
        )
    out = {}
    for layer in layers:
        shares = np.full(stats.num_experts, np.nan)
        shares[list(selection.kept(layer))] = other.load_share[other.layer_index(layer)]
        out[layer] = shares
    return out


def _load_rows(series: dict[str, dict[int, np.ndarray]], layers: Sequence[int]) -> list[dict[str, Any]]:
    """Packed ``expert, load_share`` per layer (and ``model`` when there are two); absent experts left out."""
    rows = []
    for model, shares in series.items():
        tag = {"model": model} if len(series) > 1 else {}
        for layer in layers:
            present = np.flatnonzero(np.isfinite(shares[layer]))
            rows.append(_packed(layer, present, {"load_share": _sig(shares[layer][present])}) | tag)
    return rows


def _model_encoding(names: Sequence[str]) -> dict[str, Any]:
    """Colour and bar offset by model, when there are two."""
    if len(names) == 1:
        return {}
    return {
        "color": _model_colour(names),
        "xOffset": alt.XOffset("model:N", sort=list(names)),
    }


def _model_colour(names: Sequence[str]) -> Any:
    scale = alt.Scale(domain=list(names), range=list(MODEL_COLOURS[: len(names)]))
    return alt.Color("model:N", title=None, scale=scale)


def _model_tooltip(other: RoutingStats | None) -> list[Any]:
    return [] if other is None else [alt.Tooltip("model:N")]


def _uniform_rules(
    stats: RoutingStats, other: RoutingStats | None, layers: Sequence[int], names: Sequence[str]
) -> alt.Chart:
    """Dashed rules at a balanced router's share, one per model and layer (the slider filters them)."""
    counts = [stats.num_experts] + ([] if other is None else [other.num_experts])
    rows = [
        {LAYER: layer, "model": name, "uniform": _sig1(1 / n)}
        for layer in layers
        for name, n in zip(names, counts, strict=True)
    ]
    return (
        alt.Chart(alt.InlineData(values=rows))
        .mark_rule(strokeDash=[5, 3], strokeWidth=1.5)
        .encode(
            y="uniform:Q",
            color=_model_colour(names) if other is not None else alt.value(KEPT_STROKE),
            tooltip=[alt.Tooltip("uniform:Q", title="balanced share", format=".2%")],
        )
    )


def _cluster_ticks(
    stats: RoutingStats, selection: Selection, layers: Sequence[int], x: Any, names: Sequence[str]
) -> alt.Chart:
    """At each kept expert, over the proxy's bar: the original share of the expert's whole cluster."""
    rows = []
    for layer in layers:
        entry = next(e for e in selection.layers if e.layer == layer)
        labels = np.asarray(entry.labels)
        shares = stats.load_share[stats.layer_index(layer)]
        for expert in entry.kept:
            members = labels == labels[expert] if labels[expert] >= 0 else np.arange(len(labels)) == expert
            share = _sig1(shares[members].sum())
            rows.append({LAYER: layer, EXPERT: expert, "model": names[1], "cluster_share": share})
    return (
        alt.Chart(alt.InlineData(values=rows))
        .mark_tick(color="black", thickness=2)
        .encode(
            x=x,
            y="cluster_share:Q",
            xOffset=alt.XOffset("model:N", sort=list(names)),
            tooltip=[
                alt.Tooltip(f"{EXPERT}:O"),
                alt.Tooltip("cluster_share:Q", title="its cluster's original share", format=".2%"),
            ],
        )
    )


def _versus(names: Sequence[str]) -> str:
    return f" · {names[0]} vs {names[1]}" if len(names) > 1 else ""


def _histogram_subtitle(ticks: bool) -> list[str]:
    lines = ["dashed: a balanced router's share (1 / experts)"]
    if ticks:
        lines.append(
            "black tick: the original share of the kept expert's cluster, which the proxy expert inherits"
        )
    return lines


# --------------------------------------------------------------------------------- heatmap


def routing_heatmap(
    stats: RoutingStats,
    other: RoutingStats | None = None,
    *,
    selection: Selection | None = None,
    labels: tuple[str, str] = ("original", "proxy"),
) -> alt.Chart | alt.FacetChart:
    """Overview of every layer's routing: layers × experts, colour = load ÷ a balanced share.

    Parameters
    ----------
    stats : routing statistics of the original model.
    other : a second model's statistics, drawn beside; aligned on original expert ids as in
        :func:`routing_histogram` (pass ``selection`` for a proxy). Its missing experts are grey.
    selection : the selection a proxy ``other`` was cut with.
    labels : names of ``stats`` and ``other`` above the panels.

    The colour is ``share × experts``: 1 is what a perfectly balanced router gives every
    expert, 0 a dead expert, 4 or more (clamped) a hot one. That scale is comparable between
    models of different expert counts, such as a model and its proxy.

    Examples
    --------
    >>> routing_heatmap(stats).to_dict()["mark"]["type"]  # doctest: +SKIP
    'rect'
    """
    names = labels[:1] if other is None else labels
    rows = _load_rows(_load_series(stats, other, selection, stats.layers, names), stats.layers)
    experts = f"{stats.num_experts}"
    if other is not None:
        experts = f"(datum.model === {json.dumps(names[0])} ? {stats.num_experts} : {other.num_experts})"
    chart = (
        _unpacked(rows)
        .transform_calculate(relative=f"datum.load_share * {experts}")
        .mark_rect()
        .encode(
            x=alt.X(f"{EXPERT}:O", title=EXPERT, axis=_id_axis(stats.num_experts)),
            y=alt.Y(f"{LAYER}:O", title="decoder layer", axis=_id_axis(len(stats.layers), stats.layers)),
            color=alt.Color(
                "relative:Q",
                title=["load ÷", "balanced"],
                scale=alt.Scale(scheme="blueorange", domain=[0, RELATIVE_LOAD_MAX], domainMid=1, clamp=True),
            ),
            tooltip=[
                alt.Tooltip(f"{LAYER}:O"),
                alt.Tooltip(f"{EXPERT}:O"),
                *_model_tooltip(other),
                _SHARE_TOOLTIP,
                alt.Tooltip("relative:Q", title="load ÷ balanced", format=".2f"),
            ],
        )
    )
    width = HEATMAP_WIDTH if other is None else HEATMAP_WIDTH // 2 + 40
    chart = chart.properties(width=width, height=_heatmap_height(len(stats.layers)))
    subtitle = "1 = a balanced router's share; blue: under-used (0 = dead), orange: hot"
    if other is None:
        return chart.properties(
            title=alt.Title("Routing load per layer and expert", subtitle=subtitle, anchor="start")
        )
    title = alt.Title(
        f"Routing load per layer and expert{_versus(names)}",
        subtitle=[subtitle, f"grey: experts the {names[1]} does not have"],
        anchor="start",
    )
    column = alt.Column(
        "model:N", title=None, sort=list(names), header=alt.Header(labelFontSize=12, labelFontWeight="bold")
    )
    return chart.properties(view=alt.ViewBackground(fill=ABSENT)).facet(column=column).properties(title=title)


def _heatmap_height(n_layers: int) -> int:
    return int(min(520, max(120, 10 * n_layers)))


# ---------------------------------------------------------------------------------- helpers


def _layers_to_show(layers: Sequence[int], layer: int | None) -> tuple[int, ...]:
    if layer is None:
        return tuple(layers)
    if layer not in layers:
        raise MoescopeError(f"decoder layer {layer} is not an MoE layer here; use one of {list(layers)}.")
    return (layer,)


def _check_same_model(num_experts: int, *results: Any) -> None:
    for result in results:
        if result is not None and result.num_experts != num_experts:
            raise MoescopeError(
                f"the embeddings have {num_experts} experts per layer but a {type(result).__name__} has "
                f"{result.num_experts}; pass results of the same model."
            )


def _title(template: str, layers: Sequence[int], layer: int | None) -> Any:
    """A fixed title for one layer; for the all-layer chart, one that follows the slider."""
    if layer is not None or len(layers) == 1:
        return template.format(layers[0] if layer is None else layer)
    head, tail = (json.dumps(part) for part in template.split("{}"))
    return alt.ExprRef(expr=f"{head} + {LAYER_PARAM} + {tail}")


def _with_layer_control(chart: Any, layers: Sequence[int], layer: int | None) -> Any:
    """For ``layer=None``: a slider (a dropdown for unevenly spaced layers) and a filter on it."""
    if layer is not None or len(layers) == 1:
        return chart
    steps = set(np.diff(layers).tolist())
    if len(steps) == 1:
        bind = alt.binding_range(min=layers[0], max=layers[-1], step=steps.pop(), name="layer ")
    else:
        bind = alt.binding_select(options=list(layers), name="layer ")
    param = alt.param(name=LAYER_PARAM, value=layers[0], bind=bind)
    chart = chart.add_params(param)
    predicate = f"datum.{LAYER} === {LAYER_PARAM}"
    if isinstance(chart, alt.LayerChart):
        chart.layer = [part.transform_filter(predicate) for part in chart.layer]
        return chart
    return chart.transform_filter(predicate)


def _id_axis(n: int, values: Sequence[int] | None = None, *, sorted_: bool = False) -> Any:
    """Label every id (expert, layer) when there are few, every ``n / AXIS_TICKS``-th when many."""
    if n <= 2 * AXIS_TICKS:
        return alt.Axis(labelAngle=0)
    if sorted_:
        return alt.Axis(labels=False, ticks=False)
    ids = list(values) if values is not None else list(range(n))
    return alt.Axis(values=ids[:: math.ceil(n / AXIS_TICKS)], labelAngle=0)


def _sig(values: Any, digits: int = SIGNIFICANT_DIGITS) -> list[float | None]:
    """Floats rounded to ``digits`` significant digits, ``None`` for nan/inf (JSON has neither)."""
    return [_sig1(v, digits) for v in np.asarray(values, dtype=np.float64).tolist()]


def _sig1(value: float, digits: int = SIGNIFICANT_DIGITS) -> float | None:
    return float(f"{value:.{digits}g}") if math.isfinite(value) else None


def _packed(layer: int, experts: Iterable[int], columns: dict[str, Iterable[Any]]) -> dict[str, Any]:
    """One layer's data: ``layer``, then a list per column, ``expert`` ids first."""
    return {LAYER: layer, EXPERT: [int(e) for e in experts], **{k: list(v) for k, v in columns.items()}}


def _unpacked(rows: list[dict[str, Any]], name: str | None = None, *, as_text: bool = False) -> alt.Chart:
    """A chart of packed rows (a list per column), flattened back to one datum per list item:
    per (layer, expert), or per (trace, step). ``name`` names the view (for a parameter's ``views``).

    ``as_text`` ships the rows as one JSON string that Vega parses: altair then neither copies nor
    walks the lists item by item, which for the thousands of points of a long trace is most of
    the time it takes to build the chart.
    """
    lists = [key for key, value in rows[0].items() if isinstance(value, list)]
    data = alt.InlineData(values=rows)
    if as_text:
        text = json.dumps(rows, separators=(",", ":"), allow_nan=False)
        data = alt.InlineData(values=text, format=alt.DataFormat(type="json"))
    return alt.Chart(data, **({"name": name} if name else {})).transform_flatten(lists)


# ------------------------------------------------------------------------------------ traces

DEFAULT_METRICS = (ACTOR_LOSS, GRAD_NORM, ENTROPY, REWARD_MEAN, KL, LOAD_CV)
# A gradient norm spans orders of magnitude (a spike is 1e3× the baseline): drawn on a log scale.
LOG_METRICS = frozenset({GRAD_NORM})
METRIC_TITLES = {
    ACTOR_LOSS: "loss",
    GRAD_NORM: "gradient norm",
    ENTROPY: "mean token entropy",
    REWARD_MEAN: "mean reward",
    KL: "KL to the reference",
    LOAD_CV: "expert load CV",
}
# The panel each finding type is marked on; a type not listed here (``nonfinite``) marks them all.
FINDING_PANELS = {
    "grad_spike": GRAD_NORM,
    "zero_grad": GRAD_NORM,
    "overflow": GRAD_NORM,
    "loss_divergence": ACTOR_LOSS,
    "entropy_collapse": ENTROPY,
    "entropy_surge": ENTROPY,
    "reward_collapse": REWARD_MEAN,
    "no_signal": REWARD_MEAN,
    "degenerate_output": REWARD_MEAN,
    "load_collapse": LOAD_CV,
    "kl_blowup": KL,
}
ENTROPY_FINDINGS = ("entropy_collapse", "entropy_surge")
SEVERITY_COLOURS = {"info": "#8c8c8c", "warning": "#e0a030", "error": "#d62728"}
NONFINITE_COLOUR = "#d62728"
# Values a scale cannot place, drawn as markers on the panel's edge instead of being dropped.
OFF_SCALE = ("NaN", "+Inf", "-Inf", "≤ 0")
OFF_SCALE_SHAPES = ("diamond", "triangle-up", "triangle-down", "circle")
_TOP_EDGE = ("NaN", "+Inf")
# The step-axis zoom (drag to pan, wheel to zoom) that every panel of a trace chart shares.
ZOOM = "zoom"
MAX_POINTS = 2000
# Below this many drawn points per line, each point is drawn too (a lone finite step shows).
POINTS_SHOWN = 200
TRACE_DIGITS = 4
BOARD_COLUMNS = 3
PANEL_SIZE = (230, 120)
FLOW_WIDTH = 560
FLOW_ROW_HEIGHT = 20
_EDGE_INSET = 5  # px between an off-scale marker and the panel's edge, so it is not clipped


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
        panel of the metric they concern (:data:`FINDING_PANELS`; ``nonfinite`` on every panel).
    metrics : trace keys, one panel each; :data:`LOG_METRICS` get a log scale.
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
    names = list(labels[: len(traces)]) if labels else _trace_labels(traces)
    marks = _finding_rows(names[0], findings, step_range)
    if proxy is not None:
        marks += _finding_rows(names[1], proxy_findings, step_range)
    panels, reduced = [], False
    for i, metric in enumerate(metrics):
        curves = [
            _curve(t, metric, name, max_points, step_range) for t, name in zip(traces, names, strict=True)
        ]
        reduced |= any(c.reduced for c in curves)
        shown = [m for m in marks if m["panel"] in (None, metric)]
        panels.append(_trace_panel(f"panel_{i}", metric, curves, shown, names, PANEL_SIZE))
    chart = alt.concat(*panels, columns=BOARD_COLUMNS).resolve_scale(x="shared")
    chart.params = [_zoom(chart.concat)]
    subtitle = _trace_subtitle(reduced, max_points)
    if marks:
        subtitle.append("vertical rules: findings, coloured by severity (the proxy's dashed)")
    title = f"Replay trace{' · ' + names[0] if proxy is None else _versus(names)}"
    # Legends below the panels: three columns of panels fill a notebook's width.
    chart = chart.properties(title=alt.Title(title, subtitle=subtitle, anchor="start"))
    return chart.configure_legend(orient="bottom", direction="horizontal")


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
    max_points, step_range : as in :func:`trace_board`. The heatmap has at most one column per
        pixel; a column over many steps shows their token-weighted mean.

    Heatmap cells whose steps include a NaN or ±Inf are outlined in red (filled red when no
    step of the cell is finite); empty buckets (no response that long) have no cell.

    Examples
    --------
    >>> entropy_flow(read_trace("toy.jsonl"), floor=0.3).save("entropy.png")  # doctest: +SKIP
    """
    (name,) = _trace_labels([trace])
    floor = _entropy_floor(trace) if floor is None else floor
    marks = [m for m in _finding_rows(name, findings, step_range) if m["type"] in ENTROPY_FINDINGS]
    heat = _entropy_heatmap(trace, marks, step_range, min(max_points, FLOW_WIDTH))
    curve = _curve(trace, ENTROPY, name, max_points, step_range)
    extra = [] if floor is None else [_floor_rule(floor)]
    line = _trace_panel("entropy_line", ENTROPY, [curve], marks, [name], (FLOW_WIDTH, 150), extra)
    chart = alt.vconcat(heat, line).resolve_scale(x="shared", color="independent")
    chart.params = [_zoom(chart.vconcat)]
    subtitle = _trace_subtitle(curve.reduced, max_points)
    if floor is not None:
        subtitle.append(f"dashed: the OPEFO entropy floor ({floor:g})")
    title = alt.Title(f"Token entropy over steps · {name}", subtitle=subtitle, anchor="start")
    return chart.properties(title=title)


@dataclass(frozen=True)
class _Curve:
    """One trace's metric ready to draw: packed line data, and its off-scale markers."""

    line: dict[str, Any]
    markers: list[dict[str, Any]]
    reduced: bool  # downsampled


def _curve(
    trace: Trace, metric: str, name: str, max_points: int, step_range: tuple[int, int] | None
) -> _Curve:
    """``metric`` of ``trace`` over ``step_range``, reduced to about ``max_points`` points."""
    steps, values = _scalar_series(trace, metric, step_range)
    codes = _off_scale_codes(values, log=metric in LOG_METRICS)
    kept = _downsample(codes, values, max_points)
    reduced = len(kept) < len(values)
    steps, values, codes = steps[kept], values[kept], codes[kept]
    drawn = np.where(codes == 0, values, np.nan)  # off-scale points break the line
    line = {"model": name, STEP: steps.tolist(), "value": _sig(drawn, TRACE_DIGITS)}
    markers = [
        {"model": name, STEP: int(steps[i]), "flag": OFF_SCALE[codes[i] - 1], "raw": f"{values[i]:g}"}
        for i in np.flatnonzero(codes)
    ]
    return _Curve(line, markers, reduced)


def _scalar_series(
    trace: Trace, key: str, step_range: tuple[int, int] | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` where ``key`` is a number, in step order; absent and null steps left out."""
    n = len(trace.steps)
    raw = np.fromiter((s.get(key) for s in trace.steps), object, n)  # (n,): lists stay items
    steps = np.fromiter((s.get(STEP, i) for i, s in enumerate(trace.steps)), np.int64, n)
    try:  # vectorised: 100,000 steps in about 30 ms
        logged = raw != None  # noqa: E711 (elementwise)
        values = raw[logged].astype(np.float64)
    except (TypeError, ValueError):  # something other than numbers under the key: keep the numbers
        logged = np.fromiter((isinstance(v, int | float) for v in raw), bool, len(raw))
        values = raw[logged].astype(np.float64)
    steps = steps[logged]
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    if step_range is not None:
        inside = (steps >= step_range[0]) & (steps <= step_range[1])
        steps, values = steps[inside], values[inside]
    return steps, values


def _off_scale_codes(values: np.ndarray, *, log: bool) -> np.ndarray:
    """0 where the scale can place a value, else ``1 +`` its index in :data:`OFF_SCALE`."""
    codes = np.zeros(len(values), np.int8)
    codes[np.isnan(values)] = 1
    codes[values == np.inf] = 2
    codes[values == -np.inf] = 3
    if log:
        codes[np.isfinite(values) & (values <= 0)] = 4
    return codes


def _downsample(codes: np.ndarray, values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to draw: all when few, else per bucket the min, the max and the first of each off-scale kind.

    ``max_points / 2`` buckets of consecutive steps give at most ``max_points`` finite points; a
    spike is its bucket's max, so it survives, and so does every run of NaN / ±Inf.
    """
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    bucket = np.arange(n) * buckets // n
    kept = []
    finite = np.flatnonzero(codes == 0)
    if finite.size:
        b = bucket[finite]
        order = np.lexsort((values[finite], b))  # by bucket, then value
        edge = np.flatnonzero(np.diff(b[order])) + 1
        kept += [finite[order[np.r_[0, edge]]], finite[order[np.r_[edge - 1, len(order) - 1]]]]
    off = np.flatnonzero(codes)
    if off.size:
        _, first = np.unique(bucket[off] * len(OFF_SCALE) + codes[off], return_index=True)
        kept.append(off[first])
    return np.unique(np.concatenate(kept)) if kept else np.arange(0)


def _trace_panel(
    name: str,
    metric: str,
    curves: Sequence[_Curve],
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
        _unpacked([c.line for c in curves], name=name, as_text=True)
        .mark_line(point=point, strokeWidth=1.5, clip=True)
        .encode(
            x=_step_x(),
            y=y,
            tooltip=[alt.Tooltip("model:N"), alt.Tooltip(f"{STEP}:Q"), alt.Tooltip("value:Q", format=".4g")],
            **_trace_style(models),
        )
    )
    parts = [line, *extra]
    markers = [m for c in curves for m in c.markers]
    for top in (True, False):
        edge = [m for m in markers if (m["flag"] in _TOP_EDGE) == top]
        if edge:
            parts.append(_off_scale_layer(edge, models, _EDGE_INSET if top else size[1] - _EDGE_INSET))
    if marks:
        parts.append(_finding_layer(marks, models))
    if not shown and not markers:
        parts.append(_note(f"no {metric} in {'this trace' if len(curves) == 1 else 'these traces'}", size))
    subtitle = f"{metric}{' · log scale' if log else ''}"
    title = alt.Title(METRIC_TITLES.get(metric, metric), subtitle=subtitle, anchor="start", fontSize=12)
    return alt.layer(*parts).properties(title=title, width=size[0], height=size[1])


def _step_x(field: str = STEP) -> Any:
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
            x=_step_x(),
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


def _finding_rows(
    model: str, findings: Sequence[Finding], step_range: tuple[int, int] | None
) -> list[dict[str, Any]]:
    """One row per finding with an onset step inside ``step_range`` (a finding with no step has no place)."""
    return [
        {
            "model": model,
            STEP: f.step,
            "type": f.type,
            "severity": f.severity,
            "message": f.message,
            "panel": FINDING_PANELS.get(f.type),
        }
        for f in findings
        if f.step is not None and (step_range is None or step_range[0] <= f.step <= step_range[1])
    ]


def _finding_layer(rows: list[dict[str, Any]], models: Sequence[str]) -> alt.Chart:
    """Findings as vertical rules: colour = severity, dashed for the second trace's."""
    severity = alt.Scale(domain=list(SEVERITY_COLOURS), range=list(SEVERITY_COLOURS.values()))
    encoding = {
        "x": _step_x(),
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
    """Colour (those of :func:`routing_histogram`) and dash by trace: the second trace's lines and
    findings are dashed, so a proxy curve lying exactly on the original's still shows.
    A single trace gets no legend: the title names it."""
    colour = _model_colour(models)
    if len(models) == 1:
        return {"color": colour.legend(None)}
    dashes = alt.Scale(domain=list(models), range=[[1, 0], [5, 3]])
    legend = alt.Legend(symbolType="stroke", symbolStrokeWidth=2)
    return {
        "color": colour.legend(legend),
        "strokeDash": alt.StrokeDash("model:N", scale=dashes, legend=legend),
    }


def _floor_rule(floor: float) -> alt.Chart:
    return (
        alt.Chart(alt.InlineData(values=[{"floor": floor}]))
        .mark_rule(strokeDash=[6, 3], strokeWidth=1.5, color=KEPT_STROKE)
        .encode(y="floor:Q", tooltip=[alt.Tooltip("floor:Q", title="OPEFO entropy floor")])
    )


def _note(text: str, size: tuple[int, int]) -> alt.Chart:
    """A grey line of text in the middle of an empty panel."""
    return (
        alt.Chart(alt.InlineData(values=[{"note": text}]))
        .mark_text(color=UNCLUSTERED, fontSize=12)
        .encode(text="note:N", x=alt.value(size[0] / 2), y=alt.value(size[1] / 2))
    )


def _zoom(panels: Sequence[Any]) -> Any:
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


def _trace_subtitle(reduced: bool, max_points: int) -> list[str]:
    lines = [
        "off the scale: NaN and +Inf on the top edge, -Inf (and ≤ 0 on a log scale) on the bottom",
        "drag to pan the steps of every panel, scroll to zoom, double-click resets",
    ]
    if reduced:
        lines.append(f"long series reduced to ≤ {max_points} points: min and max per bucket of steps")
    return lines


def _trace_labels(traces: Sequence[Trace]) -> list[str]:
    """``original`` / ``proxy`` from the headers (a proxy's carries its manifest); model names
    when both traces have the same role; else the two defaults."""
    roles = ["proxy" if t.header.get("proxy") else "original" for t in traces]
    if len(set(roles)) == len(roles):
        return roles
    names = [Path(str(t.header.get("model") or "")).name for t in traces]
    if all(names) and len(set(names)) == len(names):
        return names
    return ["original", "proxy"][: len(traces)]


def _entropy_floor(trace: Trace) -> float | None:
    """The floor OPEFO held entropy to in this replay, if it ran with token-entropy flow control."""
    config = trace.header.get("replay_config") or {}
    if config.get("token_entropy_flow_control") and config.get("min_entropy_floor") is not None:
        return float(config["min_entropy_floor"])
    return None


def _entropy_heatmap(
    trace: Trace, marks: list[dict[str, Any]], step_range: tuple[int, int] | None, columns: int
) -> alt.LayerChart:
    """Mean token entropy per response-position bucket (rows) and column of steps."""
    labels, steps, means, tokens = _token_entropy(trace, step_range)
    size = (FLOW_WIDTH, FLOW_ROW_HEIGHT * max(len(labels), 3))
    title = alt.Title("entropy by response position", subtitle=TOKEN_ENTROPY, anchor="start", fontSize=12)
    if not len(steps):
        note = _note("no token-entropy summaries in this trace", size)
        return alt.layer(note).properties(title=title, width=size[0], height=size[1])
    rows, broken = _entropy_cells(labels, steps, means, tokens, columns)
    y = alt.Y("position:O", title="response position", sort=labels, axis=alt.Axis(labelAngle=0))
    cells = [
        alt.Tooltip("position:N", title="positions"),
        alt.Tooltip("first:Q", title="from step"),
        alt.Tooltip("last:Q", title="to step"),
    ]
    heat = (
        _unpacked(rows, name="entropy_heatmap", as_text=True)
        .mark_rect(clip=True)
        .encode(
            x=_step_x("start"),
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
                x=_step_x("start"),
                x2="end:Q",
                y=y,
                fillOpacity=alt.condition("datum.finite", alt.value(0), alt.value(1)),
                tooltip=[*cells, alt.Tooltip("nonfinite:Q", title="steps with NaN/Inf")],
            )
        )
    if marks:
        parts.append(_finding_layer(marks, [marks[0]["model"]]))
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
                "entropy": _sig(mean[has, b]),
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


def study_chart(summary: pd.DataFrame) -> alt.HConcatChart:
    """The fidelity study per keep ratio and method: the share of the original's findings each
    proxy reproduces on time, next to how much task capability it kept (see
    :func:`moescope.export.study.study_summary`)."""
    data = summary[["keep", "method", "hit", "capability"]].melt(
        id_vars=["keep", "method"], var_name="measure", value_name="share"
    )
    labels = {"hit": "findings reproduced on time", "capability": "task accuracy, proxy / original"}
    panels = []
    for measure, title in labels.items():
        part = data[data["measure"] == measure]
        panels.append(
            alt.Chart(part, title=title)
            .mark_bar()
            .encode(
                x=alt.X("method:N", title=None, sort=list(dict.fromkeys(summary["method"]))),
                xOffset=alt.XOffset("keep:N", sort=list(dict.fromkeys(summary["keep"]))),
                y=alt.Y("share:Q", title="share", scale=alt.Scale(domain=[0, 1])),
                color=alt.Color("keep:N", title="kept", sort=list(dict.fromkeys(summary["keep"]))),
                tooltip=["keep:N", "method:N", alt.Tooltip("share:Q", format=".2f")],
            )
            .properties(width=260, height=200)
        )
    return alt.hconcat(*panels)
