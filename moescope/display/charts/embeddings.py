"""The expert map: a layer's experts in their 2-D projection, coloured by cluster, sized by load.

Kept experts are filled diamonds, dropped ones hollow circles. Clicks and drags pick experts
through the selection parameters :data:`PICK` and :data:`BRUSH`, which
:class:`moescope.display.widgets.ExpertMap` reads back as Python values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from moescope.display.charts._common import (
    KEPT_STROKE,
    MODEL_COLOURS,
    SHARE_TOOLTIP,
    TABLEAU20,
    UNCLUSTERED,
    alt,
    layer_title,
    layers_to_show,
    packed,
    sig,
    unpacked,
    with_layer_control,
)
from moescope.errors import MoescopeError
from moescope.schema import CLUSTER, EXPERT, LAYER

if TYPE_CHECKING:
    from moescope.explore.embeddings import ExpertEmbeddings
    from moescope.explore.routing import RoutingStats
    from moescope.explore.selection import Selection

__all__ = ["BRUSH", "PICK", "expert_map"]

# Names of the expert map's selection parameters; ``moescope.display.widgets`` reads them back.
PICK = "pick"
BRUSH = "brush"
MAP_SIZE = (380, 340)

_BLANK_AXIS: dict[str, Any] = {"labels": False, "ticks": False, "domain": False, "grid": False}
# Experts picked by click or brush; with no pick at all, every expert counts as picked.
_PICKED = (
    f"!(length(data('{PICK}_store')) || length(data('{BRUSH}_store')))"
    f" || vlSelectionTest('{PICK}_store', datum) || vlSelectionTest('{BRUSH}_store', datum)"
)


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
    layers = layers_to_show(embeddings.layers, layer)
    rows = _map_rows(embeddings, layers, selection, stats)
    chart = unpacked(rows)
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
    title = layer_title(f"Experts of layer {{}} · {embeddings.view} embedding", layers, layer)
    subtitle = _map_subtitle(selection is not None, stats is not None)
    chart = chart.properties(
        title=alt.Title(title, subtitle=subtitle, anchor="start"), width=MAP_SIZE[0], height=MAP_SIZE[1]
    )
    return with_layer_control(chart, layers, layer)


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
            columns |= {"load_share": sig(stats.load_share[row]), "saliency": sig(stats.saliency[row])}
        rows.append(packed(layer, range(embeddings.num_experts), columns))
    return rows


def _check_same_model(num_experts: int, *results: Any) -> None:
    for result in results:
        if result is not None and result.num_experts != num_experts:
            raise MoescopeError(
                f"the embeddings have {num_experts} experts per layer but a {type(result).__name__} has "
                f"{result.num_experts}; pass results of the same model."
            )


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


def _map_tooltip(clustered: bool, routed: bool) -> list[Any]:
    tips = [alt.Tooltip(f"{EXPERT}:O"), alt.Tooltip(f"{LAYER}:O")]
    if clustered:
        tips += [alt.Tooltip(f"{CLUSTER}:N"), alt.Tooltip("role:N", title="in the proxy")]
    if routed:
        tips += [
            SHARE_TOOLTIP,
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
