"""What every chart shares: the altair import, the colours, packed data and the in-chart layer slider.

Data travel packed (one row per layer or trace holding a list per column) with floats rounded
to a few significant digits; :func:`unpacked` flattens them back to long form inside the chart.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from moescope.errors import MoescopeError
from moescope.schema import EXPERT, LAYER

try:
    import altair as alt
except ImportError:  # pragma: no cover - the notebook extra is missing
    raise MoescopeError(
        "moescope charts need altair; install the notebook extras with pip install 'moescope[notebook]'."
    ) from None

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
MODEL_COLOURS = ("#4c78a8", "#f58518")
# Above this many experts the axes label every ``E / AXIS_TICKS``-th expert only.
AXIS_TICKS = 16

SHARE_TOOLTIP = alt.Tooltip("load_share:Q", title="token share", format=".2%")


def layers_to_show(layers: Sequence[int], layer: int | None) -> tuple[int, ...]:
    """Every layer for ``layer=None``, else the one asked for (which must be an MoE layer)."""
    if layer is None:
        return tuple(layers)
    if layer not in layers:
        raise MoescopeError(f"decoder layer {layer} is not an MoE layer here; use one of {list(layers)}.")
    return (layer,)


def layer_title(template: str, layers: Sequence[int], layer: int | None) -> Any:
    """A fixed title for one layer; for the all-layer chart, one that follows the slider."""
    if layer is not None or len(layers) == 1:
        return template.format(layers[0] if layer is None else layer)
    head, tail = (json.dumps(part) for part in template.split("{}"))
    return alt.ExprRef(expr=f"{head} + {LAYER_PARAM} + {tail}")


def with_layer_control(chart: Any, layers: Sequence[int], layer: int | None) -> Any:
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


def id_axis(n: int, values: Sequence[int] | None = None, *, sorted_: bool = False) -> Any:
    """Label every id (expert, layer) when there are few, every ``n / AXIS_TICKS``-th when many."""
    if n <= 2 * AXIS_TICKS:
        return alt.Axis(labelAngle=0)
    if sorted_:
        return alt.Axis(labels=False, ticks=False)
    ids = list(values) if values is not None else list(range(n))
    return alt.Axis(values=ids[:: math.ceil(n / AXIS_TICKS)], labelAngle=0)


def model_colour(names: Sequence[str]) -> Any:
    """Colour by model (``original`` blue, ``proxy`` orange), shared by routing and trace charts."""
    scale = alt.Scale(domain=list(names), range=list(MODEL_COLOURS[: len(names)]))
    return alt.Color("model:N", title=None, scale=scale)


def versus(names: Sequence[str]) -> str:
    """`` · original vs proxy`` for a title naming two models, else nothing."""
    return f" · {names[0]} vs {names[1]}" if len(names) > 1 else ""


def sig(values: Any, digits: int = SIGNIFICANT_DIGITS) -> list[float | None]:
    """Floats rounded to ``digits`` significant digits, ``None`` for nan/inf (JSON has neither)."""
    return [sig1(v, digits) for v in np.asarray(values, dtype=np.float64).tolist()]


def sig1(value: float, digits: int = SIGNIFICANT_DIGITS) -> float | None:
    """One float as :func:`sig` rounds it."""
    return float(f"{value:.{digits}g}") if math.isfinite(value) else None


def packed(layer: int, experts: Iterable[int], columns: dict[str, Iterable[Any]]) -> dict[str, Any]:
    """One layer's data: ``layer``, then a list per column, ``expert`` ids first."""
    return {LAYER: layer, EXPERT: [int(e) for e in experts], **{k: list(v) for k, v in columns.items()}}


def unpacked(rows: list[dict[str, Any]], name: str | None = None, *, as_text: bool = False) -> alt.Chart:
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
