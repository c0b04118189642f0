"""Charts of routing statistics, expert embeddings and selections: pure ``result → altair.Chart``.

Every function reads results (:class:`~moescope.routing.RoutingStats`,
:class:`~moescope.embeddings.ExpertEmbeddings`, :class:`~moescope.clustering.Selection`), never a
model, and returns a chart of data already aggregated to one value per (layer, expert). The
data travel packed, one row per layer holding a list per column (``expert``, ``load_share``,
...), floats rounded to three significant digits; the chart's first transform, a Vega-Lite
``flatten``, turns them into long form, one row per (layer, expert). That keeps a 58-layer ×
256-expert heatmap near 150 kB of spec instead of 800 kB of repeated keys.

- :func:`expert_map`: the 2-D projection of a layer's experts; colour = cluster, kept experts
  filled diamonds, dropped ones hollow circles, size = token share.
- :func:`routing_histogram`: one layer's load share per expert, optionally beside a second
  model's (a proxy), aligned on original expert ids.
- :func:`routing_heatmap`: layers × experts overview of the load relative to a uniform router.

With ``layer=None`` the first two carry every layer and a slider (a Vega-Lite parameter bound
to an input) that picks the layer inside the chart, so they stay interactive in the static
HTML report, with no kernel.

Examples
--------
>>> from moescope.charts import routing_heatmap
>>> chart = routing_heatmap(stats)  # doctest: +SKIP
>>> chart.save("heatmap.png")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope._schema import CLUSTER, EXPERT, LAYER
from moescope.errors import MoescopeError

try:
    import altair as alt
except ImportError:  # pragma: no cover - the notebook extra is missing
    raise MoescopeError(
        "moescope charts need altair; install the notebook extras with pip install 'moescope[notebook]'."
    ) from None

if TYPE_CHECKING:
    from moescope.clustering import Selection
    from moescope.embeddings import ExpertEmbeddings
    from moescope.routing import RoutingStats

__all__ = ["BRUSH", "PICK", "expert_map", "routing_heatmap", "routing_histogram"]

# Names of the expert map's selection parameters; ``moescope.widgets`` reads them back.
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
    chart = _per_expert(rows)
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
    bars = _per_expert(rows).mark_bar(color=MODEL_COLOURS[0])
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
        _per_expert(rows)
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


def _per_expert(rows: list[dict[str, Any]]) -> alt.Chart:
    """A chart of packed rows, flattened back to one datum per (layer, expert)."""
    lists = [key for key, value in rows[0].items() if isinstance(value, list)]
    return alt.Chart(alt.InlineData(values=rows)).transform_flatten(lists)
