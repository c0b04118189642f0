"""Widgets without a browser: set the traits the front end would set, read the Python side.

A JupyterChart's front end reports picks by setting its synced ``_vl_selections`` trait to
``{name: {"value": <vega signal>, "store": [...]}}``; the tests set it the same way.
"""

from __future__ import annotations

import dataclasses
import json

import ipywidgets
import ipywidgets.embed
import pytest
import traitlets

from moescope.display import charts
from moescope.display.widgets import ExpertMap, RoutingHistogram
from moescope.errors import MoescopeError


def _front_end_picks(chart, clicked=(), brush=None) -> None:
    """What the JupyterChart front end sends after a click (shift-clicks) and a drag."""
    points = [{"layer": layer, "expert": expert} for layer, expert in clicked]
    pick = {"vlPoint": {"or": points}} if points else None
    chart._vl_selections = {
        charts.PICK: {"value": pick, "store": []},
        charts.BRUSH: {"value": brush, "store": []},
    }


def _title(widget) -> str:
    return widget.chart.spec["title"]["text"]


@pytest.fixture
def explorer(explore_results) -> ExpertMap:
    r = explore_results
    return ExpertMap(r.embeddings, selection=r.selection, stats=r.stats)


# ------------------------------------------------------------------------------- ExpertMap


def test_expert_map_starts_on_the_first_layer(explorer: ExpertMap) -> None:
    assert (explorer.layer, explorer.view, explorer.selected) == (0, "multiview", [])
    assert explorer.layer_slider.options == (("0", 0), ("1", 1))
    assert _title(explorer) == "Experts of layer 0 · multiview embedding"
    assert explorer.chart.embed_options == {"renderer": "svg", "actions": False}
    assert "moescope-expert-map" in explorer._dom_classes


def test_slider_and_layer_trait_move_together(explorer: ExpertMap) -> None:
    explorer.layer_slider.value = 1  # what dragging the slider does
    assert explorer.layer == 1 and _title(explorer) == "Experts of layer 1 · multiview embedding"
    explorer.layer = 0
    assert explorer.layer_slider.value == 0 and _title(explorer).startswith("Experts of layer 0")
    with pytest.raises(traitlets.TraitError, match="use one of"):
        explorer.layer = 9


def test_clicked_experts_come_back_as_layer_expert_pairs(explorer: ExpertMap) -> None:
    _front_end_picks(explorer.chart, clicked=[(0, 7), (0, 3)])
    assert explorer.selected == [(0, 3), (0, 7)]
    assert explorer.picked_label.value == "picked in layer 0: experts 3, 7"
    _front_end_picks(explorer.chart)  # double-click clears
    assert explorer.selected == []


def test_brushed_experts_come_back_too(explorer: ExpertMap, explore_results) -> None:
    (data,) = explorer.chart.chart.data.values
    inside = [
        e for e, x, y in zip(data["expert"], data["x"], data["y"], strict=True) if x <= 0.5 and y >= 0.3
    ]
    assert 0 < len(inside) < 16
    _front_end_picks(explorer.chart, clicked=[(0, 15)], brush={"x": [0.5, 0.0], "y": [0.3, 1.0]})
    assert explorer.selected == sorted({(0, e) for e in inside} | {(0, 15)})


def test_changing_layer_clears_the_picks(explorer: ExpertMap) -> None:
    _front_end_picks(explorer.chart, clicked=[(0, 1)])
    explorer.layer = 1
    assert explorer.selected == []
    assert explorer.chart._vl_selections[charts.PICK] == {"value": None, "store": []}


def test_selected_is_read_only(explorer: ExpertMap) -> None:
    with pytest.raises(traitlets.TraitError):
        explorer.selected = [(0, 1)]


def test_views_dropdown(explore_results) -> None:
    r = explore_results
    weights = dataclasses.replace(r.embeddings, view="weights")
    explorer = ExpertMap({"weights": weights, "multiview": r.embeddings}, r.selection, r.stats)
    assert explorer.view == "multiview", "the view the selection was clustered in comes first"
    assert explorer.view_dropdown in explorer.children[0].children
    explorer.view_dropdown.value = "weights"
    assert explorer.view == "weights" and _title(explorer).endswith("weights embedding")
    with pytest.raises(traitlets.TraitError, match="no embeddings for view"):
        explorer.view = "router"
    single = ExpertMap(r.embeddings, layer=1)
    assert single.view_dropdown not in single.children[0].children and single.layer == 1


def test_expert_map_needs_projected_embeddings(explore_results) -> None:
    bare = dataclasses.replace(explore_results.embeddings, coords=None)
    with pytest.raises(MoescopeError, match="project"):
        ExpertMap(bare)


def test_widget_state_is_plain_json(explorer: ExpertMap) -> None:
    """The state papermill saves, which the static report draws."""
    state = ipywidgets.embed.embed_data(
        views=[explorer], state=ipywidgets.embed.dependency_state([explorer], drop_defaults=False)
    )["manager_state"]
    charts_state = [m["state"] for m in state["state"].values() if m["state"].get("spec")]
    assert len(charts_state) == 1 and charts_state[0]["spec"]["title"]["text"].startswith(
        "Experts of layer 0"
    )
    json.dumps(state, allow_nan=False)


# ------------------------------------------------------------------------- RoutingHistogram


def test_routing_histogram_controls(explore_results) -> None:
    r = explore_results
    hist = RoutingHistogram(r.stats, r.proxy, selection=r.selection)
    assert hist.compare and hist.compare_toggle.value and not hist.sort_by_load
    assert len(hist.chart.spec["layer"]) == 3, "bars, balanced share, cluster ticks"
    hist.compare_toggle.value = False
    assert not hist.compare and len(hist.chart.spec["layer"]) == 2
    hist.sort_toggle.value = True
    assert hist.sort_by_load and hist.chart.spec["layer"][0]["encoding"]["x"]["sort"]["field"] == "sort_key"
    hist.layer_slider.value = 1
    assert hist.layer == 1 and _title(hist) == "Token share per expert · layer 1"
    assert "moescope-routing-histogram" in hist._dom_classes


def test_routing_histogram_alone_has_no_compare_toggle(explore_results) -> None:
    hist = RoutingHistogram(explore_results.stats, sort_by_load=True, layer=1)
    assert hist.compare_toggle not in hist.children[0].children
    assert hist.sort_toggle.value and hist.layer_slider.value == 1
    with pytest.raises(traitlets.TraitError, match="nothing to compare"):
        hist.compare = True


def test_routing_histogram_refuses_unaligned_proxy_at_once(explore_results) -> None:
    with pytest.raises(MoescopeError, match="pass selection="):
        RoutingHistogram(explore_results.stats, explore_results.proxy)
