"""Routing load charts: one layer's token share per expert, and every layer at a glance.

A second model's statistics (a proxy) are drawn beside the original's, aligned on original
expert ids through the selection the proxy was cut with.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope.display.charts._common import (
    KEPT_STROKE,
    MODEL_COLOURS,
    SHARE_TOOLTIP,
    alt,
    id_axis,
    layer_title,
    layers_to_show,
    model_colour,
    packed,
    sig,
    sig1,
    unpacked,
    versus,
    with_layer_control,
)
from moescope.errors import MoescopeError
from moescope.schema import EXPERT, LAYER

if TYPE_CHECKING:
    from moescope.explore.routing import RoutingStats
    from moescope.explore.selection import Selection

__all__ = ["routing_heatmap", "routing_histogram"]

HISTOGRAM_SIZE = (560, 220)
HEATMAP_WIDTH = 560
ABSENT = "#c8c8c8"  # heatmap background: experts the second model does not have
# Relative load (share × experts) shown on the heatmap's colour scale; beyond is clamped.
RELATIVE_LOAD_MAX = 4.0


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
    layers = layers_to_show(stats.layers, layer)
    names = labels[:1] if other is None else labels
    rows = _load_rows(_load_series(stats, other, selection, layers, names), layers)
    x = alt.X(
        f"{EXPERT}:N",
        title="expert, busiest first" if sort_by_load else EXPERT,
        sort=alt.EncodingSortField("sort_key", op="max", order="descending") if sort_by_load else "ascending",
        axis=id_axis(stats.num_experts, sorted_=sort_by_load),
    )
    parts = [_load_bars(rows, x, names, sort_by_load), _uniform_rules(stats, other, layers, names)]
    if selection is not None and other is not None:
        parts.append(_cluster_ticks(stats, selection, layers, x, names))
    title = layer_title(f"Token share per expert · layer {{}}{versus(names)}", layers, layer)
    chart = alt.layer(*parts).properties(
        title=alt.Title(title, subtitle=_histogram_subtitle(len(parts) == 3), anchor="start"),
        width=HISTOGRAM_SIZE[0],
        height=HISTOGRAM_SIZE[1],
    )
    return with_layer_control(chart, layers, layer)


def _load_bars(rows: list[dict[str, Any]], x: Any, names: Sequence[str], sort_by_load: bool) -> alt.Chart:
    """A bar per expert (and model); sorted by the first model's share when ``sort_by_load``."""
    bars = unpacked(rows).mark_bar(color=MODEL_COLOURS[0])
    if sort_by_load:
        first = (
            f"datum.model === {json.dumps(names[0])} ? datum.load_share : 0"
            if len(names) > 1
            else "datum.load_share"
        )
        bars = bars.transform_calculate(sort_key=first)
    return bars.encode(
        x=x,
        y=alt.Y("load_share:Q", title="token share", axis=alt.Axis(format="%")),
        tooltip=[alt.Tooltip(f"{EXPERT}:O"), *_model_tooltip(names), SHARE_TOOLTIP],
        **_model_encoding(names),
    )


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
            rows.append(packed(layer, present, {"load_share": sig(shares[layer][present])}) | tag)
    return rows


def _model_encoding(names: Sequence[str]) -> dict[str, Any]:
    """Colour and bar offset by model, when there are two."""
    if len(names) == 1:
        return {}
    return {
        "color": model_colour(names),
        "xOffset": alt.XOffset("model:N", sort=list(names)),
    }


def _model_tooltip(names: Sequence[str]) -> list[Any]:
    return [] if len(names) == 1 else [alt.Tooltip("model:N")]


def _uniform_rules(
    stats: RoutingStats, other: RoutingStats | None, layers: Sequence[int], names: Sequence[str]
) -> alt.Chart:
    """Dashed rules at a balanced router's share, one per model and layer (the slider filters them)."""
    counts = [stats.num_experts] + ([] if other is None else [other.num_experts])
    rows = [
        {LAYER: layer, "model": name, "uniform": sig1(1 / n)}
        for layer in layers
        for name, n in zip(names, counts, strict=True)
    ]
    return (
        alt.Chart(alt.InlineData(values=rows))
        .mark_rule(strokeDash=[5, 3], strokeWidth=1.5)
        .encode(
            y="uniform:Q",
            color=model_colour(names) if other is not None else alt.value(KEPT_STROKE),
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
            share = sig1(shares[members].sum())
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
    width = HEATMAP_WIDTH if other is None else HEATMAP_WIDTH // 2 + 40
    chart = _heatmap_cells(rows, stats, other, names)
    chart = chart.properties(width=width, height=_heatmap_height(len(stats.layers)))
    subtitle = "1 = a balanced router's share; blue: under-used (0 = dead), orange: hot"
    if other is None:
        return chart.properties(
            title=alt.Title("Routing load per layer and expert", subtitle=subtitle, anchor="start")
        )
    title = alt.Title(
        f"Routing load per layer and expert{versus(names)}",
        subtitle=[subtitle, f"grey: experts the {names[1]} does not have"],
        anchor="start",
    )
    column = alt.Column(
        "model:N", title=None, sort=list(names), header=alt.Header(labelFontSize=12, labelFontWeight="bold")
    )
    return chart.properties(view=alt.ViewBackground(fill=ABSENT)).facet(column=column).properties(title=title)


def _heatmap_cells(
    rows: list[dict[str, Any]], stats: RoutingStats, other: RoutingStats | None, names: Sequence[str]
) -> alt.Chart:
    """A cell per (layer, expert) coloured by load ÷ balanced share, each model at its expert count."""
    experts = f"{stats.num_experts}"
    if other is not None:
        experts = f"(datum.model === {json.dumps(names[0])} ? {stats.num_experts} : {other.num_experts})"
    return (
        unpacked(rows)
        .transform_calculate(relative=f"datum.load_share * {experts}")
        .mark_rect()
        .encode(
            x=alt.X(f"{EXPERT}:O", title=EXPERT, axis=id_axis(stats.num_experts)),
            y=alt.Y(f"{LAYER}:O", title="decoder layer", axis=id_axis(len(stats.layers), stats.layers)),
            color=alt.Color(
                "relative:Q",
                title=["load ÷", "balanced"],
                scale=alt.Scale(scheme="blueorange", domain=[0, RELATIVE_LOAD_MAX], domainMid=1, clamp=True),
            ),
            tooltip=[
                alt.Tooltip(f"{LAYER}:O"),
                alt.Tooltip(f"{EXPERT}:O"),
                *_model_tooltip(names),
                SHARE_TOOLTIP,
                alt.Tooltip("relative:Q", title="load ÷ balanced", format=".2f"),
            ],
        )
    )


def _heatmap_height(n_layers: int) -> int:
    return int(min(520, max(120, 10 * n_layers)))
