"""Widgets for clusters, routing and replay traces: :mod:`moescope.display.charts` plus controls.

They read results, never a model. State lives in Python traits (``layer``, ``view``,
``sort_by_load``, ``compare``, ``step_range``, ``metrics``); the controls are linked to them, so
setting a trait from Python moves the control and redraws the chart, and moving the control
sets the trait. Charts are
``altair.JupyterChart`` widgets, so what a user picks in a chart comes back as Python values:
:attr:`ExpertMap.selected` holds ``(layer, expert)`` pairs.

Charts render without a network once :func:`moescope.setup_notebook` has run (it switches
``JupyterChart`` to its offline bundle). In a static HTML report there is no kernel to redraw a
chart, so a widget shows the state it was saved in; the charts drawn with ``layer=None`` carry
their own layer slider for that, and the trace charts their own step zoom.

Examples
--------
>>> from moescope.display.widgets import ExpertMap, RoutingHistogram
>>> explorer = ExpertMap(embeddings.project(), selection, stats)  # doctest: +SKIP
>>> explorer  # doctest: +SKIP
>>> explorer.selected  # after clicking two experts of layer 3  # doctest: +SKIP
[(3, 5), (3, 12)]
>>> RoutingHistogram(stats, proxy_stats, selection=selection)  # doctest: +SKIP
>>> TraceBoard(trace, proxy_trace, findings, proxy_findings)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import traitlets

from moescope.display import charts
from moescope.errors import MoescopeError
from moescope.schema import CANONICAL_METRICS, EXPERT, LAYER, STEP

try:
    import altair as alt
    import ipywidgets
except ImportError:  # pragma: no cover - the notebook extra is missing
    raise MoescopeError(
        "moescope widgets need ipywidgets and altair; install the notebook extras with "
        "pip install 'moescope[notebook]'."
    ) from None

if TYPE_CHECKING:
    from moescope.analyze.findings import Finding
    from moescope.explore.embeddings import ExpertEmbeddings
    from moescope.explore.routing import RoutingStats
    from moescope.explore.selection import Selection
    from moescope.traces import Trace

__all__ = ["EntropyFlow", "ExpertMap", "RoutingHistogram", "TraceBoard"]

# vega-embed options of every chart: SVG (crisp, and its marks are DOM nodes), no action menu.
EMBED_OPTIONS = {"renderer": "svg", "actions": False}
# The trace charts clip their marks to each panel (for the step zoom). In SVG a clip is a
# ``<clipPath id="clip1">`` numbered by vega, and every JupyterChart in JupyterLab loads its own
# copy of vega, so two charts on a page reuse ids and clip each other's marks: drawn on a canvas.
TRACE_EMBED_OPTIONS = {"renderer": "canvas", "actions": False}


class _LayerPanel(ipywidgets.VBox):
    """A chart of one decoder layer at a time, under a row of controls."""

    layer = traitlets.Int(help="Decoder layer shown; one of the results' MoE layers.")

    def __init__(self, layers: Sequence[int], layer: int | None = None, **kwargs: Any) -> None:
        self._layers = tuple(layers)
        self.layer = self._layers[0] if layer is None else layer
        super().__init__(**kwargs)
        self.layer_slider = ipywidgets.SelectionSlider(
            options=[(str(n), n) for n in self._layers],
            value=self.layer,
            description="layer",
            continuous_update=False,
        )
        traitlets.link((self.layer_slider, "value"), (self, "layer"))
        self.chart = alt.JupyterChart(self._make_chart(), embed_options=EMBED_OPTIONS)

    @traitlets.validate("layer")
    def _check_layer(self, proposal: dict[str, Any]) -> int:
        if proposal["value"] not in self._layers:
            raise traitlets.TraitError(
                f"layer {proposal['value']} is not an MoE layer of these results; "
                f"use one of {list(self._layers)}"
            )
        return proposal["value"]

    def _redraw(self, change: dict[str, Any] | None = None) -> None:
        self.chart.chart = self._make_chart()

    def _make_chart(self) -> alt.TopLevelMixin:
        raise NotImplementedError


class ExpertMap(_LayerPanel):
    """The expert map of :func:`moescope.display.charts.expert_map`, a layer slider and a view dropdown.

    Parameters
    ----------
    embeddings : projected embeddings, or a mapping ``view name → embeddings`` of one model
        (e.g. ``{"weights": ..., "multiview": ...}``); a dropdown then switches between them.
    selection : colours clusters and marks kept experts.
    stats : sizes experts by token share; adds token share and saliency to the tooltips.
    layer, view : what to show first; default the first MoE layer, and the view the selection
        was clustered in (else the first view).

    Click an expert to pick it (shift-click adds more), drag to pick a rectangle, double-click
    to clear: :attr:`selected` follows. The widget carries the CSS class ``moescope-expert-map``.

    Examples
    --------
    >>> explorer = ExpertMap({"multiview": emb.project()}, selection, stats)  # doctest: +SKIP
    >>> explorer.layer = 3  # moves the slider and redraws  # doctest: +SKIP
    """

    view = traitlets.Unicode(help="Embedding view shown; a key of the embeddings given.")
    selected = traitlets.List(
        traitlets.Tuple(traitlets.Int(), traitlets.Int()),
        read_only=True,
        help="(layer, expert) pairs picked in the chart, sorted: clicked or inside the brushed "
        "rectangle. Cleared when the layer or the view changes.",
    )

    def __init__(
        self,
        embeddings: ExpertEmbeddings | Mapping[str, ExpertEmbeddings],
        selection: Selection | None = None,
        stats: RoutingStats | None = None,
        *,
        layer: int | None = None,
        view: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._views = _by_view(embeddings)
        self._selection, self._stats = selection, stats
        self.view = view or _default_view(self._views, selection)
        super().__init__(self._views[self.view].layers, layer, **kwargs)
        self.view_dropdown = ipywidgets.Dropdown(
            options=list(self._views), value=self.view, description="view"
        )
        traitlets.link((self.view_dropdown, "value"), (self, "view"))
        self.picked_label = ipywidgets.HTML()
        controls = [self.layer_slider] + ([self.view_dropdown] if len(self._views) > 1 else [])
        self.children = (ipywidgets.HBox(controls), self.chart, self.picked_label)
        self.add_class("moescope-expert-map")
        self.observe(self._redraw, ["layer", "view"])
        self.chart.observe(self._read_picks, "_vl_selections")
        self._show_picks()

    @traitlets.validate("view")
    def _check_view(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in self._views:
            raise traitlets.TraitError(
                f"no embeddings for view {proposal['value']!r}; use one of {list(self._views)}"
            )
        return proposal["value"]

    def _make_chart(self) -> alt.Chart:
        return charts.expert_map(self._views[self.view], self._selection, self._stats, layer=self.layer)

    def _redraw(self, change: dict[str, Any] | None = None) -> None:
        self.set_trait("selected", [])
        super()._redraw(change)
        self._show_picks()

    def _read_picks(self, change: dict[str, Any]) -> None:
        """Turn the chart's selection state (set by the front end) into ``(layer, expert)`` pairs."""
        state = change["new"] or {}
        pairs = set(_clicked(state.get(charts.PICK)))
        pairs |= {(self.layer, e) for e in _brushed(state.get(charts.BRUSH), self.chart.chart)}
        self.set_trait("selected", sorted(pairs))
        self._show_picks()

    def _show_picks(self) -> None:
        experts = ", ".join(str(e) for _, e in self.selected)
        self.picked_label.value = (
            f"picked in layer {self.layer}: experts {experts}" if experts else "click or drag to pick experts"
        )


class RoutingHistogram(_LayerPanel):
    """The load histogram of :func:`moescope.display.charts.routing_histogram` with its controls.

    Parameters
    ----------
    stats : routing statistics of the original model.
    other : a second model's statistics (a proxy); adds the compare toggle.
    selection : the selection the proxy was cut with, when ``other`` has fewer experts; it also
        adds a tick at each kept expert for its cluster's original share.
    layer, sort_by_load : what to show first.
    compare : start with ``other``'s bars shown; default whenever ``other`` is given.
    labels : names of the two models.

    The widget carries the CSS class ``moescope-routing-histogram``.

    Examples
    --------
    >>> hist = RoutingHistogram(stats, proxy_stats, selection=selection)  # doctest: +SKIP
    >>> hist.sort_by_load = True  # doctest: +SKIP
    """

    sort_by_load = traitlets.Bool(False, help="Order experts by the original load, busiest first.")
    compare = traitlets.Bool(False, help="Show the second model's bars beside the original's (needs other).")

    def __init__(
        self,
        stats: RoutingStats,
        other: RoutingStats | None = None,
        selection: Selection | None = None,
        *,
        layer: int | None = None,
        sort_by_load: bool = False,
        compare: bool | None = None,
        labels: tuple[str, str] = ("original", "proxy"),
        **kwargs: Any,
    ) -> None:
        self._stats, self._other, self._selection, self._labels = stats, other, selection, labels
        if other is not None:
            charts.routing_histogram(stats, other, layer=stats.layers[0], selection=selection)  # fail early
        self.sort_by_load = sort_by_load
        self.compare = other is not None if compare is None else compare
        super().__init__(stats.layers, layer, **kwargs)
        self.sort_toggle = ipywidgets.ToggleButton(value=self.sort_by_load, description="sort by load")
        self.compare_toggle = ipywidgets.ToggleButton(
            value=self.compare, description=f"compare with {labels[1]}"
        )
        traitlets.link((self.sort_toggle, "value"), (self, "sort_by_load"))
        traitlets.link((self.compare_toggle, "value"), (self, "compare"))
        controls = [self.layer_slider, self.sort_toggle] + (
            [self.compare_toggle] if other is not None else []
        )
        self.children = (ipywidgets.HBox(controls), self.chart)
        self.add_class("moescope-routing-histogram")
        self.observe(self._redraw, ["layer", "sort_by_load", "compare"])

    @traitlets.validate("compare")
    def _check_compare(self, proposal: dict[str, Any]) -> bool:
        if proposal["value"] and self._other is None:
            raise traitlets.TraitError(
                "there is nothing to compare with; pass other= (a second RoutingStats)"
            )
        return proposal["value"]

    def _make_chart(self) -> alt.LayerChart:
        other = self._other if self.compare else None
        return charts.routing_histogram(
            self._stats,
            other,
            layer=self.layer,
            sort_by_load=self.sort_by_load,
            labels=self._labels,
            selection=self._selection if other is not None else None,
        )


def _by_view(embeddings: ExpertEmbeddings | Mapping[str, ExpertEmbeddings]) -> dict[str, ExpertEmbeddings]:
    views = dict(embeddings) if isinstance(embeddings, Mapping) else {embeddings.view: embeddings}
    if not views:
        raise MoescopeError(
            "ExpertMap needs at least one ExpertEmbeddings; pass embed_experts(...).project()."
        )
    layers = {emb.layers for emb in views.values()}
    if len(layers) > 1:
        raise MoescopeError("the embeddings given cover different layers; pass views of one model.")
    return views


def _default_view(views: Mapping[str, ExpertEmbeddings], selection: Selection | None) -> str:
    """The view the selection was clustered in, when given; else the first."""
    if selection is not None and selection.view in views:
        return selection.view
    return next(iter(views))


def _clicked(state: Mapping[str, Any] | None) -> list[tuple[int, int]]:
    """``(layer, expert)`` pairs of the point selection's vega signal, ``{"vlPoint": {"or": [...]}}``."""
    value = (state or {}).get("value") or {}
    points = value.get("vlPoint", {}).get("or", [])
    return [(int(p[LAYER]), int(p[EXPERT])) for p in points]


def _brushed(state: Mapping[str, Any] | None, chart: Any) -> list[int]:
    """Experts of the chart's data inside the interval selection's ``{"x": [a, b], "y": [c, d]}``."""
    value = (state or {}).get("value") or {}
    if "x" not in value or "y" not in value:
        return []
    (x0, x1), (y0, y1) = sorted(value["x"]), sorted(value["y"])
    (layer_data,) = chart.data.values  # one layer, packed: expert, x, y lists
    points = zip(layer_data[EXPERT], layer_data["x"], layer_data["y"], strict=True)
    return [int(e) for e, x, y in points if x0 <= x <= x1 and y0 <= y <= y1]


class _StepRangePanel(ipywidgets.VBox):
    """A chart of replay traces over a range of steps, under a step-range slider.

    The chart's own zoom only rescales the points it was given (a long trace arrives reduced to
    ``max_points``); moving the slider redraws it from the traces, at full detail inside the range.
    """

    step_range = traitlets.Tuple(
        traitlets.Int(), traitlets.Int(), help="First and last step drawn (inclusive); redraws on change."
    )

    def __init__(self, traces: Sequence[Trace], **kwargs: Any) -> None:
        self._bounds = _step_bounds(traces)
        self.step_range = self._bounds
        super().__init__(**kwargs)
        self.range_slider = ipywidgets.IntRangeSlider(
            value=self.step_range,
            min=self._bounds[0],
            max=self._bounds[1],
            description="steps",
            continuous_update=False,
            layout=ipywidgets.Layout(width="480px"),
        )
        traitlets.link((self.range_slider, "value"), (self, "step_range"))
        self.chart = alt.JupyterChart(self._make_chart(), embed_options=TRACE_EMBED_OPTIONS)

    @traitlets.validate("step_range")
    def _check_step_range(self, proposal: dict[str, Any]) -> tuple[int, int]:
        first, last = proposal["value"]
        low, high = self._bounds
        if not low <= first <= last <= high:
            raise traitlets.TraitError(
                f"step_range must be (first, last) with {low} <= first <= last <= {high}"
            )
        return first, last

    def _redraw(self, change: dict[str, Any] | None = None) -> None:
        self.chart.chart = self._make_chart()

    def _chart_range(self) -> tuple[int, int] | None:
        """The range to pass to a chart: ``None`` for the whole trace, so it draws as it would alone."""
        return None if self.step_range == self._bounds else self.step_range

    def _make_chart(self) -> alt.TopLevelMixin:
        raise NotImplementedError


class EntropyFlow(_StepRangePanel):
    """The token-entropy flow of :func:`moescope.display.charts.entropy_flow` with a step-range slider.

    Parameters
    ----------
    trace : a replay trace with ``actor/token_entropy`` summaries.
    floor : the OPEFO entropy floor drawn under the mean; default the trace's own, when its
        replay ran with token-entropy flow control.
    findings : findings of the trace; entropy collapses and surges are marked.

    The widget carries the CSS class ``moescope-entropy-flow``.

    Examples
    --------
    >>> flow = EntropyFlow(read_trace("toy.jsonl"), findings=diagnose(trace))  # doctest: +SKIP
    >>> flow.step_range = (100, 400)  # moves the slider and redraws  # doctest: +SKIP
    """

    floor = traitlets.Float(None, allow_none=True, help="OPEFO entropy floor drawn; None: the trace's own.")

    def __init__(
        self, trace: Trace, floor: float | None = None, findings: Sequence[Finding] = (), **kwargs: Any
    ) -> None:
        self._trace, self._findings = trace, tuple(findings)
        self.floor = floor
        super().__init__([trace], **kwargs)
        self.children = (self.range_slider, self.chart)
        self.add_class("moescope-entropy-flow")
        self.observe(self._redraw, ["step_range", "floor"])

    def _make_chart(self) -> alt.VConcatChart:
        return charts.entropy_flow(
            self._trace, floor=self.floor, findings=self._findings, step_range=self._chart_range()
        )


class TraceBoard(_StepRangePanel):
    """The small multiples of :func:`moescope.display.charts.trace_board`, a metric picker and a step range.

    Parameters
    ----------
    original, proxy : replay traces; the proxy's curves are overlaid in a second colour.
    findings, proxy_findings : findings of each trace, marked on the panels they concern.
    metrics : panels to show first; the picker offers every canonical metric the traces hold.
    labels : names of the two traces; default from their headers.

    The widget carries the CSS class ``moescope-trace-board``.

    Examples
    --------
    >>> board = TraceBoard(trace, proxy_trace, diagnose(trace), diagnose(proxy_trace))  # doctest: +SKIP
    >>> board.metrics = (ACTOR_LOSS, GRAD_NORM)  # keys from moescope.schema  # doctest: +SKIP
    """

    metrics = traitlets.Tuple(help="Metric keys drawn, one panel each, in this order.")

    def __init__(
        self,
        original: Trace,
        proxy: Trace | None = None,
        findings: Sequence[Finding] = (),
        proxy_findings: Sequence[Finding] = (),
        *,
        metrics: Sequence[str] = charts.DEFAULT_METRICS,
        labels: tuple[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        traces = [original] + ([proxy] if proxy is not None else [])
        self._original, self._proxy, self._labels = original, proxy, labels
        self._findings, self._proxy_findings = tuple(findings), tuple(proxy_findings)
        self._available = _metrics_in(traces, metrics)
        self.metrics = tuple(metrics)
        super().__init__(traces, **kwargs)
        self.metric_picker = ipywidgets.SelectMultiple(
            options=self._available, value=self.metrics, description="metrics", rows=4
        )
        traitlets.link((self.metric_picker, "value"), (self, "metrics"))
        self.children = (ipywidgets.HBox([self.metric_picker, self.range_slider]), self.chart)
        self.add_class("moescope-trace-board")
        self.observe(self._redraw, ["step_range", "metrics"])

    @traitlets.validate("metrics")
    def _check_metrics(self, proposal: dict[str, Any]) -> tuple[str, ...]:
        metrics = tuple(proposal["value"])
        if not metrics:
            raise traitlets.TraitError("pick at least one metric")
        return metrics

    def _make_chart(self) -> alt.ConcatChart:
        return charts.trace_board(
            self._original,
            self._proxy,
            findings=self._findings,
            proxy_findings=self._proxy_findings,
            metrics=self.metrics,
            step_range=self._chart_range(),
            labels=self._labels,
        )


def _step_bounds(traces: Sequence[Trace]) -> tuple[int, int]:
    """First and last step over the traces; ``(0, 0)`` when they have none."""
    steps = [int(s.get(STEP, i)) for t in traces for i, s in enumerate(t.steps)]
    return (min(steps), max(steps)) if steps else (0, 0)


def _metrics_in(traces: Sequence[Trace], shown: Sequence[str]) -> tuple[str, ...]:
    """The picker's options: the metrics shown, then every other canonical metric a trace holds."""
    held = set().union(*(s.keys() for t in traces for s in t.steps))
    return (*shown, *(m for m in CANONICAL_METRICS if m in held and m not in shown))
