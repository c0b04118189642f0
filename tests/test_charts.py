"""Chart specs, checked through ``to_dict()`` (and a few through vl-convert's SVG)."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from moescope.display import charts
from moescope.display.charts import expert_map, routing_heatmap, routing_histogram
from moescope.display.charts._common import LAYER_PARAM, UNCLUSTERED
from moescope.display.charts.routing import ABSENT
from moescope.errors import MoescopeError


def _flat(spec: dict) -> list[dict]:
    """The chart's data in long form, as its flatten transform makes it (one dataset)."""
    (rows,) = spec["datasets"].values()
    return [
        {**row, **{key: row[key][i] for key in row if isinstance(row[key], list)}}
        for row in rows
        for i in range(len(row["expert"]))
    ]


def _params(spec: dict) -> dict[str, dict]:
    return {p["name"]: p for p in spec.get("params", [])}


@pytest.fixture
def big_stats(make_routing_stats):
    """58 MoE layers (decoder layers 3-60) × 256 experts, top-8, uneven load."""
    rng = np.random.default_rng(0)
    shares = rng.dirichlet(np.full(256, 0.6), size=58)
    counts = np.stack([rng.multinomial(20_000 * 8, row) for row in shares])
    return make_routing_stats(counts, layers=range(3, 61), top_k=8)


# ----------------------------------------------------------------------------------- expert map


def test_expert_map_of_one_layer(explore_results) -> None:
    r = explore_results
    spec = expert_map(r.embeddings, r.selection, r.stats, layer=1).to_dict()
    assert spec["mark"]["type"] == "point"
    assert spec["transform"][0] == {
        "flatten": ["expert", "x", "y", "cluster", "kept", "load_share", "saliency"]
    }
    rows = _flat(spec)
    assert [row["expert"] for row in rows] == list(range(16)) and {row["layer"] for row in rows} == {1}
    assert [row["expert"] for row in rows if row["kept"]] == list(r.selection.kept(1))
    assert [row["cluster"] for row in rows] == list(r.selection.layers[1].labels)
    assert all(0 <= row["x"] <= 1 and 0 <= row["y"] <= 1 for row in rows)
    share = r.stats.load_share[1]
    assert [row["load_share"] for row in rows] == pytest.approx(share, rel=1e-2)
    assert spec["title"]["text"] == "Experts of layer 1 · multiview embedding"
    assert set(_params(spec)) == {charts.PICK, charts.BRUSH}
    assert _params(spec)[charts.PICK]["select"]["fields"] == ["layer", "expert"]


def test_expert_map_marks_kept_experts_and_tooltips(explore_results) -> None:
    r = explore_results
    encoding = expert_map(r.embeddings, r.selection, r.stats, layer=0).to_dict()["encoding"]
    tips = {t["field"] for t in encoding["tooltip"]}
    assert {"expert", "layer", "cluster", "role", "load_share", "saliency"} <= tips
    assert encoding["shape"]["scale"] == {"domain": ["kept", "dropped"], "range": ["diamond", "circle"]}
    assert encoding["fill"]["condition"]["test"] == "datum.kept" and encoding["fill"]["value"] == "white"
    assert encoding["size"]["field"] == "load_share"
    assert encoding["fill"]["condition"]["legend"]["title"] == "cluster"


def test_expert_map_without_selection_or_stats(explore_results) -> None:
    spec = expert_map(explore_results.embeddings, layer=0).to_dict()
    assert spec["transform"][0] == {"flatten": ["expert", "x", "y"]}
    assert {t["field"] for t in spec["encoding"]["tooltip"]} == {"expert", "layer"}
    assert "fill" not in spec["encoding"]


def test_expert_map_of_all_layers_has_a_slider_inside(explore_results) -> None:
    r = explore_results
    spec = expert_map(r.embeddings, r.selection, r.stats).to_dict()
    slider = _params(spec)[LAYER_PARAM]
    assert slider["value"] == 0
    assert slider["bind"] == {"input": "range", "min": 0, "max": 1, "step": 1, "name": "layer "}
    assert {"filter": f"datum.layer === {LAYER_PARAM}"} in spec["transform"]
    assert {row["layer"] for row in _flat(spec)} == {0, 1}
    assert LAYER_PARAM in spec["title"]["text"]["expr"]


def test_layers_every_other_step_or_uneven(explore_results) -> None:
    emb = explore_results.embeddings
    every_other = dataclasses.replace(emb, layers=(1, 3))
    bind = _params(expert_map(every_other).to_dict())[LAYER_PARAM]["bind"]
    assert (bind["input"], bind["min"], bind["max"], bind["step"]) == ("range", 1, 3, 2)
    uneven = dataclasses.replace(
        emb,
        layers=(1, 2, 4),
        vectors=np.concatenate([emb.vectors, emb.vectors[:1]]),
        coords=np.concatenate([emb.coords, emb.coords[:1]]),
    )
    bind = _params(expert_map(uneven).to_dict())[LAYER_PARAM]["bind"]
    assert bind == {"input": "select", "options": [1, 2, 4], "name": "layer "}


def test_baseline_selections_show_unclustered_experts_grey(explore_results) -> None:
    from moescope.explore.clustering import select_experts

    r = explore_results
    frequency = select_experts(r.embeddings, 4, method="frequency", stats=r.stats)
    scale = expert_map(r.embeddings, frequency, layer=0).to_dict()["encoding"]["fill"]["condition"]["scale"]
    assert scale["domain"] == [-1, 0, 1, 2, 3] and scale["range"][0] == UNCLUSTERED


def test_expert_map_refuses_what_it_cannot_draw(explore_results, make_routing_stats) -> None:
    r = explore_results
    with pytest.raises(MoescopeError, match=r"call embeddings.project\(\) first"):
        expert_map(dataclasses.replace(r.embeddings, coords=None))
    with pytest.raises(MoescopeError, match="use one of"):
        expert_map(r.embeddings, layer=7)
    other = make_routing_stats(np.ones((2, 8), np.int64))
    with pytest.raises(MoescopeError, match="same model"):
        expert_map(r.embeddings, stats=other)


def test_expert_map_renders_one_point_per_expert(explore_results) -> None:
    import vl_convert

    r = explore_results
    svg = vl_convert.vegalite_to_svg(expert_map(r.embeddings, r.selection, r.stats, layer=0).to_dict())
    assert svg.count('aria-roledescription="point"') == 16
    assert "Experts of layer 0" in svg


# --------------------------------------------------------------------------------- histogram


def test_histogram_of_one_layer(explore_results) -> None:
    stats = explore_results.stats
    spec = routing_histogram(stats, layer=0).to_dict()
    bars, rule = spec["layer"]
    assert bars["mark"]["type"] == "bar" and rule["mark"]["type"] == "rule"
    rows = _flat({"datasets": {"d": spec["datasets"][bars["data"]["name"]]}})
    assert [row["expert"] for row in rows] == list(range(16))
    assert sum(row["load_share"] for row in rows) == pytest.approx(1, abs=0.01)
    (uniform,) = spec["datasets"][rule["data"]["name"]]
    assert uniform["uniform"] == pytest.approx(1 / 16)
    assert spec["title"]["text"] == "Token share per expert · layer 0"
    assert "color" not in bars["encoding"]


def test_histogram_sorted_by_load(explore_results) -> None:
    spec = routing_histogram(explore_results.stats, layer=0, sort_by_load=True).to_dict()
    bars = spec["layer"][0]
    assert bars["encoding"]["x"]["sort"] == {"field": "sort_key", "op": "max", "order": "descending"}
    assert {"calculate": "datum.load_share", "as": "sort_key"} in bars["transform"]
    assert bars["encoding"]["x"]["title"] == "expert, busiest first"


def test_histogram_aligns_a_proxy_on_original_ids(explore_results) -> None:
    r = explore_results
    spec = routing_histogram(r.stats, r.proxy, layer=1, selection=r.selection).to_dict()
    bars, _, ticks = spec["layer"]
    rows = _flat({"datasets": {"d": spec["datasets"][bars["data"]["name"]]}})
    proxy = [row for row in rows if row["model"] == "proxy"]
    assert [row["expert"] for row in proxy] == list(r.selection.kept(1))
    assert [row["load_share"] for row in proxy] == pytest.approx(r.proxy.load_share[1], rel=1e-2)
    assert bars["encoding"]["xOffset"]["field"] == "model"
    labels = np.asarray(r.selection.layers[1].labels)
    expected = [r.stats.load_share[1][labels == labels[e]].sum() for e in r.selection.kept(1)]
    tick_rows = spec["datasets"][ticks["data"]["name"]]
    assert [t["cluster_share"] for t in tick_rows] == pytest.approx(expected, rel=1e-2)
    assert "original vs proxy" in spec["title"]["text"]


def test_histogram_needs_the_selection_to_align_fewer_experts(explore_results) -> None:
    r = explore_results
    with pytest.raises(MoescopeError, match="pass selection="):
        routing_histogram(r.stats, r.proxy, layer=0)


def test_histogram_of_two_models_with_the_same_experts(explore_results, make_routing_stats) -> None:
    stats = explore_results.stats
    later = make_routing_stats(stats.counts[:, ::-1], stats.layers, stats.top_k)
    spec = routing_histogram(stats, later, labels=("before", "after"), layer=0).to_dict()
    rows = _flat({"datasets": {"d": spec["datasets"][spec["layer"][0]["data"]["name"]]}})
    after = {row["expert"]: row["load_share"] for row in rows if row["model"] == "after"}
    assert after[0] == pytest.approx(stats.load_share[0][15], rel=1e-2)
    assert len(spec["layer"]) == 2, "no cluster ticks without a selection"


def test_histogram_of_all_layers_filters_every_part(explore_results) -> None:
    r = explore_results
    spec = routing_histogram(r.stats, r.proxy, selection=r.selection).to_dict()
    assert LAYER_PARAM in _params(spec)
    for part in spec["layer"]:
        assert {"filter": f"datum.layer === {LAYER_PARAM}"} in part["transform"]


# ----------------------------------------------------------------------------------- heatmap


def test_heatmap_colours_load_relative_to_balanced(explore_results) -> None:
    stats = explore_results.stats
    spec = routing_heatmap(stats).to_dict()
    assert spec["mark"]["type"] == "rect"
    assert {"calculate": "datum.load_share * 16", "as": "relative"} in spec["transform"]
    colour = spec["encoding"]["color"]
    assert colour["field"] == "relative" and colour["scale"]["domainMid"] == 1
    assert len(_flat(spec)) == 2 * 16


def test_heatmap_side_by_side_with_a_proxy(explore_results) -> None:
    r = explore_results
    spec = routing_heatmap(r.stats, r.proxy, selection=r.selection).to_dict()
    assert spec["facet"]["column"]["field"] == "model"
    assert spec["spec"]["view"]["fill"] == ABSENT
    rows = _flat(spec)
    assert sum(row["model"] == "proxy" for row in rows) == 2 * r.selection.keep
    relative = spec["spec"]["transform"][1]["calculate"]
    assert relative == 'datum.load_share * (datum.model === "original" ? 16 : 4)'


def test_a_58_by_256_heatmap_stays_small_and_fast(big_stats) -> None:
    start = time.perf_counter()
    text = json.dumps(routing_heatmap(big_stats).to_dict())
    elapsed = time.perf_counter() - start
    assert len(text) < 300_000, f"{len(text)} bytes"
    assert elapsed < 2.0, f"{elapsed:.2f} s"
    axis = json.loads(text)["encoding"]["x"]["axis"]
    assert axis["values"][:3] == [0, 16, 32], "256 expert labels would overlap"


def test_charts_round_floats_to_three_significant_digits(big_stats) -> None:
    spec = routing_histogram(big_stats, layer=3).to_dict()
    shares = [
        row["load_share"]
        for row in _flat({"datasets": {"d": spec["datasets"][spec["layer"][0]["data"]["name"]]}})
    ]
    assert len(shares) == 256 and all(s == float(f"{s:.3g}") for s in shares)
    assert shares != [float(f"{s:.2g}") for s in shares]
